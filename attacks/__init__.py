"""Built-in attacks, one technique family per module.

Each attack cites its paper and is registered through the ``redteam.attacks`` entry
point group, exactly as third-party attacks are.
"""

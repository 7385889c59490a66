"""Built-in defenses: validation filters, robust aggregators, pre- and post-processing.

Each module holds one technique family and cites its paper. They are registered
through the ``redteam.defenses`` entry point group, exactly as third-party defenses are.
"""

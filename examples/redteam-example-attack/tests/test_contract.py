from redteam.testing import check_attack


def test_example_scale_meets_the_plugin_contract():
    check_attack("example_scale")

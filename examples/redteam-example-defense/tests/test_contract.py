from redteam.testing import check_defense


def test_example_clipped_mean_meets_the_plugin_contract():
    check_defense("example_clipped_mean")

"""Scenario validation: every mistake names the file, the key, the value and what is allowed."""

import pytest

from redteam.errors import InvalidScenario
from redteam.scenario import PluginSpec, load_scenario, parse_scenario


def test_smoke_parses():
    sc = load_scenario("scenarios/smoke.toml")
    assert sc.name == "smoke"
    assert sc.federation.clients == 20 and sc.federation.n_malicious == 4
    assert sc.attack == PluginSpec("sign_flip", {"variant": "own", "scale": 4.0})
    assert sc.defense[0].name == "norm_bound"
    assert sc.transport.network.relay_fraction == 0.3
    assert len(sc.digest()) == 64


def test_defaults():
    sc = parse_scenario({})
    assert sc.attack.name == "none" and sc.defense == (PluginSpec("mean"),)
    assert sc.hierarchy.depth == 1


@pytest.mark.parametrize(
    "doc,msg",
    [
        ({"federation": {"clients": -3}}, "x.toml: [federation].clients = -3: must be an integer ≥ 1"),
        ({"federation": {"clients": "ten"}}, '[federation].clients = "ten": expected an integer'),
        ({"federation": {"clinets": 3}}, "unknown key 'clinets'; did you mean 'clients'?"),
        ({"federation": {"partition": "zipf"}}, '[federation].partition = "zipf": expected one of "iid"'),
        ({"federation": {"malicious_fraction": 1.0}}, "[federation].malicious_fraction = 1.0: must be in [0, 1)"),
        ({"fedration": {}}, "unknown section [fedration]; did you mean [federation]?"),
        ({"attack": {"name": "sing_flip"}}, "unknown attack 'sing_flip'; did you mean 'sign_flip'"),
        ({"attack": {"name": "sign_flip", "varient": "own"}}, "no parameter 'varient'; did you mean 'variant'?"),
        ({"attack": {"name": "sign_flip", "variant": "all"}}, "variant"),
        ({"attack": {"variant": "own"}}, "[attack] needs a 'name' key"),
        ({"defense": {"name": "norm_bound", "bound": -1.0}}, "NormBound.bound = -1.0: must be a finite number > 0"),
        ({"defense": {"pipeline": []}}, "[defense].pipeline = []: must be a non-empty list"),
        ({"defense": {"pipeline": [{"name": "mean"}], "name": "x"}}, "takes no other keys"),
        ({"transport": {"codec": "zip"}}, "[transport]"),
        ({"transport": {"chunk_size": 1}}, "[transport].chunk_size = 1"),
        ({"transport": {"network": {"loss": 2}}}, "[transport.network].loss = 2: must be in [0, 1)"),
        ({"transport": {"network": {"bandwith_mbps": 2}}}, "did you mean 'bandwidth_mbps'"),
        ({"hierarchy": {"depth": 0}}, "[hierarchy].depth = 0"),
        ({"workload": {"name": "imagenet"}}, "unknown workload 'imagenet'"),
        ({"workload": {"name": "digits", "model": "resnet"}}, "model"),
        ({"scenario": {"seed": -1}}, "[scenario].seed = -1"),
    ],
)
def test_errors_name_the_key(doc, msg):
    with pytest.raises(InvalidScenario) as ei:
        parse_scenario(doc, file="x.toml")
    assert msg in str(ei.value), str(ei.value)
    assert str(ei.value).startswith("x.toml")


def test_pipeline_order_checked():
    with pytest.raises(InvalidScenario, match="ordered"):
        parse_scenario({"defense": {"pipeline": [{"name": "mean"}, {"name": "norm_bound"}]}}, file="x.toml")


def test_file_errors(tmp_path):
    with pytest.raises(InvalidScenario, match="no such scenario file"):
        load_scenario(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[federation\nclients = 3")
    with pytest.raises(InvalidScenario, match="bad.toml: invalid TOML"):
        load_scenario(bad)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InvalidScenario, match="not UTF-8"):
        load_scenario(binary)


def test_digest_changes_with_content():
    a = parse_scenario({"federation": {"clients": 5}})
    b = parse_scenario({"federation": {"clients": 6}})
    assert a.digest() != b.digest()
    assert a.digest() == parse_scenario({"federation": {"clients": 5}}).digest()

"""Contract properties of every built-in update and data attack of the catalog.

For random honest/own matrices: the rows come back as (f, d) in the input dtype and
device; inputs are not mutated; the same seed gives the same rows; finite in gives
finite out (except for ``nonfinite``, whose purpose is the opposite).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import redteam
from redteam.types import AttackContext, ClientData, Surface

UPDATE_ATTACKS = {
    "gaussian": {},
    "nonfinite": {"fraction": 0.3},
    "alie": {},
    "alie_impl_own": {"z": "implementation", "knowledge": "own"},
    "ipm": {},
    "min_max": {},
    "min_sum": {"dev_type": "std"},
    "fang_trim": {},
    "fang_krum": {},
    "mimic": {},
    "free_rider": {"mode": "stale", "noise_std": 0.1},
    "sybil": {"jitter": 0.01},
    "model_replacement": {},
    "norm_hug": {"bound": 2.0},
    "norm_evasion": {"bound": 2.0},
    "cosine_evasion": {"threshold": 0.2, "bound": 2.0},
    "adaptive": {"attack": "alie"},
    "neurotoxin": {"topk_fraction": 0.3, "masking": "after_training"},
    "agr_tailored": {"search": "grid", "evals": 4},
    "alie_opt": {"evals": 6},
    "ipm_opt": {"evals": 6},
    "constrain_and_scale": {"norm_bound": 50.0},
    "sparse_capture": {"k_fraction": 0.5},
    "scale_inflation": {},
    "ef_flush": {},
}


def build(key: str):
    name = key.split("_impl")[0]
    return redteam.attack(name, **UPDATE_ATTACKS[key])


@st.composite
def contexts(draw):
    h = draw(st.integers(5, 7))  # h ≥ f + 2 keeps fang_krum's n − 2f − 1 ≥ 1
    f = draw(st.integers(2, 3))  # ≥ 2 own rows so 'own' knowledge has a ddof = 1 std
    d = draw(st.integers(1, 6))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    vals = st.floats(-10, 10, allow_nan=False, allow_infinity=False, width=32)
    honest = torch.tensor(draw(st.lists(st.lists(vals, min_size=d, max_size=d), min_size=h, max_size=h)),
                          dtype=dtype)
    own = torch.tensor(draw(st.lists(st.lists(vals, min_size=d, max_size=d), min_size=f, max_size=f)),
                       dtype=dtype)
    seed = draw(st.integers(0, 2**31 - 1))
    return honest, own, seed


def ctx_of(honest, own, seed, defense=None) -> AttackContext:
    f = own.shape[0]
    n = honest.shape[0] + f
    return AttackContext(
        round=2, n_clients=n, malicious=tuple(range(1, 1 + f)), own_updates=own, visible_updates=honest,
        global_params=torch.zeros(own.shape[1], dtype=own.dtype), generator=torch.Generator().manual_seed(seed),
        previous_update=honest[0].clone(), server_lr=1.0, defense=defense,
    )


@pytest.mark.parametrize("key", sorted(UPDATE_ATTACKS))
@settings(max_examples=15, deadline=None)
@given(data=contexts())
def test_update_attack_contract(key, data):
    honest, own, seed = data
    atk = build(key)
    assert Surface.UPDATES in atk.surfaces
    defense = redteam.defense("norm_bound", bound=5.0, mode="reject") if key == "adaptive" else None
    h0, o0 = honest.clone(), own.clone()
    out = atk.craft_updates(ctx_of(honest, own, seed, defense))
    assert out.shape == own.shape and out.dtype == own.dtype and out.device == own.device
    assert torch.equal(honest, h0) and torch.equal(own, o0)  # inputs untouched
    again = atk.craft_updates(ctx_of(honest, own, seed, defense))
    assert torch.equal(torch.nan_to_num(out, nan=123.0), torch.nan_to_num(again, nan=123.0))
    assert torch.equal(torch.isnan(out), torch.isnan(again))
    if key == "nonfinite":
        assert not torch.isfinite(out).all(dim=1).any()  # every row carries a non-finite value
    else:
        assert torch.isfinite(out).all()
    assert out.data_ptr() not in (own.data_ptr(), honest.data_ptr())  # fresh rows, not a view


@pytest.mark.parametrize("key", ["norm_hug", "norm_evasion", "cosine_evasion"])
@settings(max_examples=15, deadline=None)
@given(data=contexts())
@example(data=(torch.tensor([[0.0, 0.0], [0.0, float(torch.tensor(0.8))], [5.0, 0.0], [5.0, 1.0], [5.0, 1.0]],
                            dtype=torch.float64), torch.zeros(2, 2, dtype=torch.float64), 0))
def test_envelope_rows_never_exceed_the_bound(key, data):
    from defenses.norm import l2_norms

    honest, own, seed = data
    out = build(key).craft_updates(ctx_of(honest, own, seed))
    # measured as the norm rule measures (float64-accumulated at the bound): another
    # float64 norm may round the same row an ulp higher (a row whose exact norm is 2 + 1e-17
    # is 2.0 to one and 2.0000000000000004 to another); fit_norm's promise is the rule's
    assert bool((l2_norms(out, near=2.0) <= 2.0).all())
    assert bool((torch.linalg.vector_norm(out.to(torch.float64), dim=1) <= 2.0 * (1 + 4 * 2.0**-52)).all())


DATA_ATTACKS = {
    "label_flip": {"fraction": 0.5},
    "label_flip_pairs": {"mapping": "pairs", "pairs": [[1, 2], [2, 1]]},
    "backdoor": {},
    "backdoor_append": {"mode": "append", "fraction": 0.3},
}


@pytest.mark.parametrize("key", sorted(DATA_ATTACKS))
@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 12), labels=st.data(), seed=st.integers(0, 2**31 - 1))
def test_data_attack_contract(key, n, labels, seed):
    name = key.split("_pairs")[0].split("_append")[0]
    atk = redteam.attack(name, **DATA_ATTACKS[key])
    assert Surface.DATA in atk.surfaces
    y = torch.tensor(labels.draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)), dtype=torch.int64)
    x = torch.rand(n, 64, generator=torch.Generator().manual_seed(seed))
    data = ClientData(x=x, y=y)
    x0, y0 = x.clone(), y.clone()
    out = atk.poison_data(data, 0, torch.Generator().manual_seed(seed))
    again = atk.poison_data(data, 0, torch.Generator().manual_seed(seed))
    assert torch.equal(x, x0) and torch.equal(y, y0)
    assert torch.equal(out.x, again.x) and torch.equal(out.y, again.y)
    assert out.x.dtype == x.dtype and out.y.dtype == torch.int64 and out.x.shape[1:] == x.shape[1:]
    assert out.y.shape[0] == out.x.shape[0] >= n
    assert bool(((out.y >= 0) & (out.y < 10)).all())


def test_every_catalog_attack_is_registered_with_summary_and_reference():
    for name in ["gaussian", "nonfinite", "alie", "ipm", "min_max", "min_sum", "fang_trim", "fang_krum",
                 "mimic", "free_rider", "sybil", "label_flip", "backdoor", "model_replacement",
                 "norm_hug", "norm_evasion", "cosine_evasion", "adaptive",
                 "neurotoxin", "sparse_capture", "scale_inflation", "ef_flush",
                 "agr_tailored", "alie_opt", "ipm_opt", "constrain_and_scale", "edge_case", "dba"]:
        info = redteam.ATTACKS.info(name)
        assert info.summary and info.reference, name
        cls = redteam.ATTACKS.get(name)
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert hasattr(cls, "__slots__")


def test_large_float32_inputs_match_the_float64_path():
    # above attacks._common.F64_LIMIT elements the statistics run in float32; they must
    # agree with the float64 computation to float32 accuracy
    from attacks._common import F64_LIMIT

    g = torch.Generator().manual_seed(5)
    h, d = 17, F64_LIMIT // 16  # 17·d > F64_LIMIT
    honest = torch.randn(h, d, generator=g) * 0.1 + 0.02
    own = torch.randn(2, d, generator=g) * 0.1
    for name, params in [("alie", {}), ("min_max", {}), ("cosine_evasion", {"threshold": 0.2, "bound": 1.0,
                                                                             "target": "own"})]:
        atk = redteam.attack(name, **params)
        out32 = atk.craft_updates(ctx_of(honest, own, 0))
        out64 = atk.craft_updates(ctx_of(honest.double(), own.double(), 0))
        assert out32.dtype == torch.float32
        assert torch.allclose(out32.double(), out64, rtol=1e-4, atol=1e-6), name

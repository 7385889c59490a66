"""A data attack that relabels outside the workload's classes is a one-line error naming the
attack and the fix, not a traceback from inside cross-entropy (label_flip's default
num_classes = 10 on the 4-class synthetic workload used to crash with 'index 8 is out of
bounds')."""

from __future__ import annotations

from redteam.cli import main


def test_label_flip_outside_the_workloads_classes_is_a_one_line_error(tmp_path, capsys):
    f = tmp_path / "s.toml"
    body = ('[scenario]\nname = "lf"\nseed = 0\n[workload]\nname = "synthetic"\nclasses = 4\n'
            '[federation]\nclients = 4\nrounds = 1\nmalicious_fraction = 0.25\n'
            '[attack]\nname = "label_flip"\n')
    f.write_text(body)
    assert main(["run", str(f), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    # reverse mapping with C = 10: y ∈ [0, 3] ↦ 9 − y ∈ [6, 9], outside [0, 4)
    assert "attack 'label_flip'" in err and "outside the workload's 4 classes [0, 4)" in err
    assert "set num_classes = 4" in err
    # with the workload's class count it runs
    f.write_text(body + "num_classes = 4\n")
    assert main(["run", str(f), "--quiet"]) == 0

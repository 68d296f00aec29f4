"""``python -m deploy.site --check``: a site checks its paths, its policy and its own
data against a run config without joining; and a site that would join with a path
that does not exist stops before it starts anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.site import main
from tests.helpers import image_folder

RUN = "method='fedper' model='cnn4' class-names='bright,dark' input-shape='3,16,16'"


def folder(root: Path, classes: tuple[str, ...], side: int = 16) -> Path:
    return image_folder(root, classes, per_class=4, side=side)


def check(tmp_path: Path, data: Path, run: str = RUN, *extra: str) -> int:
    """deploy.site's exit status for ``--check`` of this site against ``run``."""
    argv = ["--check", "--site", "site-a", "--data-path", str(data)]
    argv += ["--state-dir", str(tmp_path / "state"), "--run-config", run, *extra]
    try:
        main(argv)
        return 0
    except SystemExit as err:
        return int(err.code or 0)


def test_a_site_whose_data_fit_the_run_is_ready(tmp_path, capsys) -> None:
    data = folder(tmp_path / "data", ("bright", "dark"))
    assert check(tmp_path, data) == 0
    out = capsys.readouterr().out
    assert "label ids [0, 1] of the run's 2" in out and "site 'site-a': ready for this run" in out
    assert "classes bright->0 dark->1\n" in out  # the run's ids by name
    assert not (tmp_path / "state").exists()  # a check writes nothing on the site


def test_without_class_names_the_site_sees_which_folder_got_which_id(tmp_path, capsys) -> None:
    """#46: with num-classes only, the upper-case folder sorts first; the check says so."""
    data = folder(tmp_path / "data", ("Malignant", "benign"))
    run = RUN.replace("class-names='bright,dark'", "num-classes=2")
    assert check(tmp_path, data, run) == 0
    assert "classes Malignant->0 benign->1 (by this site's folder order)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("layout", "run", "extra", "named"),
    [
        # a class the run does not list: the silent label shift of #36, caught before joining
        (("bright", "dim"), RUN, (), "config key 'class-names'"),
        (("bright", "dark"), RUN.replace("3,16,16", "3,32,32"), (), "config key 'input-shape'"),
        (
            ("bright", "dark"),
            RUN.replace("fedper", "fedcp"),
            (),
            "site policy 'accept-disclosures'",
        ),
        (("bright", "dark"), RUN, ("--allowed-methods", "fedavg"), "site policy 'allowed-methods'"),
        (("bright", "dark"), RUN + " alpha=-1", (), "config key 'alpha'"),
        (("bright", "dark"), RUN, ("--device", "cuda:7"), "--device cuda:7"),
        (("bright", "dark"), RUN, ("--auth-key", "/no/key"), "--auth-key /no/key"),
    ],
)
def test_what_does_not_fit_is_one_line_and_exit_2(
    tmp_path, capsys, layout, run, extra, named
) -> None:
    data = folder(tmp_path / "data", layout)
    assert check(tmp_path, data, run, *extra) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("site check FAILED:") and named in err[0], err


def test_a_missing_data_path_stops_the_site_before_it_joins(tmp_path, capsys) -> None:
    argv = ["--superlink", "127.0.0.1:1", "--insecure", "--site", "a"]
    argv += ["--data-path", str(tmp_path / "nope"), "--state-dir", str(tmp_path / "s")]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert "--data-path" in capsys.readouterr().err and not (tmp_path / "s").exists()

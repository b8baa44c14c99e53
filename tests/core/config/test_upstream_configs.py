"""Every training config of the upstream repository validates unchanged (issue 16).

The files under ``upstream/`` are copies of the upstream's (eduardoslonski/telescope at
f002cb2; ``upstream/README.md`` says where each comes from). First each copy is checked
to still be the upstream's byte for byte (its git blob hash), then ``telescope config
validate`` must accept it: ``--defaults`` for the defaults file, which is a layer
without environments. The keys these files use beyond the reference documents are
the ones issue 16 added (loss controls, overlong and output filters, inference limits,
``eager_prepare_resources``, ``fsdp_context_parallel_size``) and the environments'
upstream keyword arguments (``dapo_math``, ``deepscaler``, ``add_thinking_prefix``,
wordle's ``max_turns``, i3_code's ``provider``/``pool_size``/``memory_mb``/``disk_size_gb``).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import yaml

from telescope.cli.main import main
from telescope.config.loader import load_config

pytestmark = pytest.mark.requires_dist("telescope-envs")

UPSTREAM = Path(__file__).parent / "upstream"
BLOBS = dict(
    (path, blob)
    for blob, path in re.findall(r"\| `([0-9a-f]{40})` \| `([^`]+)` \|", (UPSTREAM / "README.md").read_text())
)
DEFAULTS = "configs/defaults/default_train.yaml"


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_the_copies_are_the_upstream_files_unchanged() -> None:
    on_disk = sorted(str(p.relative_to(UPSTREAM)) for p in UPSTREAM.rglob("*.yaml"))
    assert on_disk == sorted(BLOBS), "every copy is listed in upstream/README.md, and nothing else is there"
    assert len(BLOBS) == 9  # default_train, run and the seven examples
    for path, blob in BLOBS.items():
        assert git_blob((UPSTREAM / path).read_bytes()) == blob, f"{path} is not the upstream's file any more"


@pytest.mark.parametrize("path", sorted(BLOBS))
def test_telescope_config_validate_accepts_it(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["config", "validate", *(["--defaults"] if path == DEFAULTS else []), str(UPSTREAM / path)]
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith("ok: ")


def test_the_upstream_defaults_are_telescopes_but_the_code_snapshot_exclusions_and_the_bind_address() -> None:
    """Every key of the upstream defaults file is a field, and its value is Telescope's default too,
    except the code snapshot's exclusions (Telescope's own list; docs/upstream-differences.md) and
    ``inference_host`` (``auto``: servers bind only where the run reaches them, not ``0.0.0.0``)."""
    upstream = yaml.safe_load((UPSTREAM / DEFAULTS).read_text())
    as_layer = load_config(UPSTREAM / DEFAULTS, layer=True).config
    assert {k for k, v in upstream.items() if getattr(as_layer, k) != v} == set()  # taken as given
    defaults = load_config(None, {"environments": [{"name": "countdown"}]}).config
    differing = {k for k, v in upstream.items() if getattr(defaults, k) != v}
    assert differing == {"wandb_code_exclude_patterns", "inference_host"}


def test_a_defaults_layer_still_needs_valid_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "defaults.yaml"
    broken.write_text((UPSTREAM / DEFAULTS).read_text().replace("tis_cap: 2.0", "tis_cap: -1"))
    assert main(["config", "validate", "--defaults", str(broken)]) == 2
    assert "tis_cap" in capsys.readouterr().err
    assert main(["config", "validate", str(UPSTREAM / DEFAULTS)]) == 2  # as a run: no environment
    assert "at least one environment" in capsys.readouterr().err


def test_fsdp_context_parallel_size_must_divide_trainer_num_workers() -> None:
    from telescope.config.errors import ConfigError

    values = {"environments": [{"name": "countdown"}], "trainer_num_workers": 4}
    for size in (1, 2, 4):
        config = load_config(None, {**values, "fsdp_context_parallel_size": size}).config
        assert config.fsdp_context_parallel_size == size
    message = r"trainer_num_workers \(4\) must be a multiple of fsdp_context_parallel_size \(3\)"
    with pytest.raises(ConfigError, match=message):
        load_config(None, {**values, "fsdp_context_parallel_size": 3})

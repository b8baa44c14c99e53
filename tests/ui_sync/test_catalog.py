"""Every metric of the metrics reference (seeds 000/001) has its place in its section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from telescope_ui_sync.catalog import REFERENCE_METRICS, SECTION_ORDER, classify, section_rank


@pytest.mark.parametrize(("name", "section"), sorted(REFERENCE_METRICS.items()))
def test_reference_metric_is_in_its_section(name: str, section: str) -> None:
    assert classify(name).section == section


def test_naming_rule_for_custom_keys() -> None:
    assert classify("custom/my_metric") == classify("custom/my_metric")
    place = classify("debug/grads/layer_norm")
    assert (place.section, place.group, place.label) == ("Debug", "grads", "layer_norm")
    assert classify("some_new_scalar").section == "General"


def test_sections_keep_the_reference_order() -> None:
    assert sorted(["Zeta", *reversed(SECTION_ORDER), "Alpha"], key=section_rank) == [*SECTION_ORDER, "Alpha", "Zeta"]


def test_every_metric_a_real_run_writes_has_a_section(real_run_source: Path) -> None:
    names = set()
    for line in (real_run_source / "metrics.jsonl").read_text().splitlines():
        names |= set(json.loads(line)) - {"step", "time"}
    places = {name: classify(name) for name in names}
    assert places["reward/mean"].section == "Reward"
    assert places["timing_forward_microbatch_mean"].group.startswith("Per microbatch")
    assert all(place.section for place in places.values())

"""What docs/upstream-differences.md and the schema say of ``kl_estimator: k3``: capped, so an underestimate."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from telescope.api.algorithm import KL_K3_MAX, kl_penalty
from telescope.schema.config import TelescopeConfig

DOC = Path(__file__).resolve().parents[3] / "docs" / "upstream-differences.md"


def k3_paragraph() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("- `kl_estimator: k3`")
    return " ".join(text[start : text.index("\n- ", start + 1)].split())


def test_the_docs_state_the_cap_and_that_it_underestimates() -> None:
    paragraph = k3_paragraph()
    assert f"min(exp(d) - 1 - d, {KL_K3_MAX:g})" in paragraph and "underestimate" in paragraph
    [above] = re.findall(r"`d` above about ([\d.]+)", paragraph)
    assert float(kl_penalty(torch.tensor([float(above) - 0.05]), torch.tensor([0.0]), "k3")) < KL_K3_MAX
    assert float(kl_penalty(torch.tensor([float(above) + 0.05]), torch.tensor([0.0]), "k3")) == KL_K3_MAX


def test_the_schema_describes_the_cap() -> None:
    description = TelescopeConfig.model_fields["kl_estimator"].description or ""
    assert f"min(exp(d) - 1 - d, {KL_K3_MAX:g})" in description and "underestimate" in description


def test_the_cap_underestimates_a_large_drift() -> None:
    """The docs' claim: on a drifted policy the capped mean is below the KL it estimates."""
    generator = torch.Generator().manual_seed(0)
    sampler = torch.log_softmax(torch.randn(4000, 50, generator=generator), -1)
    policy = torch.log_softmax(sampler + 3 * torch.randn(4000, 50, generator=generator), -1)
    weights = sampler.exp()
    true_kl = float((weights * (sampler - policy)).sum(-1).mean())
    capped = float((weights * kl_penalty(policy, sampler, "k3")).sum(-1).mean())
    assert 0.9 * true_kl < capped < 0.99 * true_kl

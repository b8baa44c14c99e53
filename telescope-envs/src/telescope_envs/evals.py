"""Dedicated evals: :class:`~telescope.api.EvalSpec` objects, registered lazily by name.

Each is an environment class plus the dataset arguments of its benchmark; config
``kwargs`` override them (for example a local file as ``dataset_name``).

=================  =============================  =======  ==========================
eval               dataset_name                   split    environment
=================  =============================  =======  ==========================
``math500``        ``HuggingFaceH4/MATH-500``     test     boxed answer, math-verify
``aime_2024``      ``HuggingFaceH4/aime_2024``    train    boxed answer, math-verify
``aime_2025``      ``yentinglin/aime_2025``       train    boxed answer, math-verify
``gpqa_diamond``   ``Idavidrein/gpqa``            train    multiple choice (A-D)
=================  =============================  =======  ==========================
"""

from __future__ import annotations

from telescope.api.evals import EvalSpec
from telescope_envs.gpqa import GPQA_DATASET, GPQAEnvironment
from telescope_envs.hendrycks_math import MathEnvironment

MATH500 = EvalSpec(
    name="math500",
    environment=MathEnvironment,
    default_kwargs={"dataset_name": "HuggingFaceH4/MATH-500", "dataset_split": "test"},
    description="500 MATH test problems (Lightman et al.), boxed answers checked with math-verify",
)
AIME_2024 = EvalSpec(
    name="aime_2024",
    environment=MathEnvironment,
    default_kwargs={"dataset_name": "HuggingFaceH4/aime_2024", "dataset_split": "train"},
    description="AIME 2024 (30 problems), integer answers in \\boxed{}",
)
AIME_2025 = EvalSpec(
    name="aime_2025",
    environment=MathEnvironment,
    default_kwargs={"dataset_name": "yentinglin/aime_2025", "dataset_split": "train"},
    description="AIME 2025 (30 problems), integer answers in \\boxed{}",
)
GPQA_DIAMOND = EvalSpec(
    name="gpqa_diamond",
    environment=GPQAEnvironment,
    default_kwargs={"dataset_name": GPQA_DATASET, "dataset_subset": "gpqa_diamond", "dataset_split": "train"},
    description="GPQA diamond (198 questions), four-way multiple choice",
)

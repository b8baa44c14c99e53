"""The built-in RL algorithms, one module each.

:data:`CAPABILITIES` is the single, torch-free table of what each algorithm
supports; the plugin registers the algorithms lazily with it, and each algorithm
class points its ``capabilities`` attribute at its row.
"""

from telescope.api.algorithm import AlgorithmCapabilities

_GROUP = AlgorithmCapabilities(group_based=True, supports_ppo_clip=True, ratio_based=False)
_RATIO = AlgorithmCapabilities(group_based=True, supports_ppo_clip=False, ratio_based=True)

CAPABILITIES: dict[str, AlgorithmCapabilities] = {
    "grpo": _GROUP,
    "rloo": _GROUP,
    "dr_grpo": _GROUP,
    "reinforce_pp": AlgorithmCapabilities(
        group_based=True,
        supports_ppo_clip=True,
        ratio_based=False,
        advantage_norms=("batch",),
        default_advantage_norm="batch",
    ),
    "cispo": _RATIO,
    # its loss is a PPO-clipped sequence ratio: clip_ratio_c (dual clip) applies to it
    "gspo": AlgorithmCapabilities(group_based=True, supports_ppo_clip=False, ratio_based=True, clipped_ratio=True),
    "sapo": _RATIO,
}

#: name -> "module:Class" of each built-in algorithm.
TARGETS: dict[str, str] = {
    "grpo": "telescope.algorithms.grpo:GRPO",
    "rloo": "telescope.algorithms.rloo:RLOO",
    "dr_grpo": "telescope.algorithms.dr_grpo:DrGRPO",
    "reinforce_pp": "telescope.algorithms.reinforce_pp:ReinforcePP",
    "cispo": "telescope.algorithms.cispo:CISPO",
    "gspo": "telescope.algorithms.gspo:GSPO",
    "sapo": "telescope.algorithms.sapo:SAPO",
}

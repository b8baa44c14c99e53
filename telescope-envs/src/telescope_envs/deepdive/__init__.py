"""deepdive: the multi-turn web-research agent with a judge-model reward.

One concept per module:

- :mod:`.environment`: :class:`DeepDiveEnvironment`, the tools, the rollout and the reward;
- :mod:`.search`: the search backend interface and Serper (upstream's default);
- :mod:`.pages`: the page backend interface and HTTP fetching (HTML/PDF to text);
- :mod:`.corpus`: a local corpus, its BM25 search and pages (offline runs and tests);
- :mod:`.lines`: what ``scan_page`` and ``open_lines`` render;
- :mod:`.judge`: the judge interface, a model behind an OpenAI-compatible endpoint,
  and a string-match judge.
"""

from __future__ import annotations

from telescope_envs.deepdive.environment import DeepDiveEnvironment

__all__ = ["DeepDiveEnvironment"]

"""The built-in compactors: the conformance kit, then what each keeps and drops."""

from __future__ import annotations

import asyncio

import pytest

from telescope.api.compaction import Compaction, CompactionFailed, Compactor, EpisodeHistory, PolicyHandle
from telescope.api.context import CompactionContext
from telescope.compaction.builtins import (
    SUMMARY_HEADER,
    TOOL_OUTPUT_MARKER,
    DropToolOutputs,
    Sliding,
    Summarize,
)
from telescope.plugins.facade import get_plugins
from telescope.plugins.registry import PluginKind
from telescope.testing.compaction import CompactorConformance, ScriptedPolicy, long_episode

CONTEXT = CompactorConformance.context


class TestSummarize(CompactorConformance):
    factory = staticmethod(Summarize)


class TestDropToolOutputs(CompactorConformance):
    factory = staticmethod(DropToolOutputs)


class TestSliding(CompactorConformance):
    factory = staticmethod(Sliding)


class KeepsEverything(Compactor):
    name = "keeps_everything"

    async def compact(self, episode: EpisodeHistory, policy: PolicyHandle) -> Compaction:
        return Compaction(history=list(episode.history))


class AsksTwice(Compactor):
    name = "asks_twice"

    async def compact(self, episode: EpisodeHistory, policy: PolicyHandle) -> Compaction:
        first = await policy.reply([{"role": "user", "content": "a"}])
        await policy.reply([{"role": "user", "content": "b"}])
        return Compaction(history=[{"role": "user", "content": first.text}], replies=[first])


class EmptiesInPlace(Compactor):
    name = "empties_in_place"

    async def compact(self, episode: EpisodeHistory, policy: PolicyHandle) -> Compaction:
        episode.history.clear()
        return Compaction(history=[])


@pytest.mark.parametrize(
    ("compactor", "test"),
    [
        (KeepsEverything, "test_returns_a_shorter_history_of_messages"),
        (AsksTwice, "test_asks_the_policy_at_most_once_and_returns_only_its_replies"),
        (EmptiesInPlace, "test_leaves_the_episode_as_it_was"),
    ],
)
def test_the_kit_catches_a_broken_compactor(compactor: type[Compactor], test: str) -> None:
    kit = type("Kit", (CompactorConformance,), {"factory": staticmethod(compactor)})()
    with pytest.raises(AssertionError):
        getattr(kit, test)()


def compact(compactor: Compactor, episode: EpisodeHistory, policy: ScriptedPolicy) -> Compaction:
    return asyncio.run(compactor.compact(episode, policy))


def test_the_three_are_registered_and_built_from_the_config() -> None:
    from telescope.config.loader import load_config

    plugins = get_plugins()
    assert {"summarize", "drop_tool_outputs", "sliding"} <= set(plugins.registry.names(PluginKind.COMPACTION))
    values = {
        "environments": [{"name": "countdown"}],
        "compaction": "sliding",
        "compaction_keep_turns": 3,
        "max_tokens": 512,
    }
    config = load_config(None, values, check_plugins=False).config
    built = plugins.create_compactor(config)
    assert isinstance(built, Sliding) and built.context.keep_turns == 3
    assert built.context.working_limit == int(config.compaction_threshold * config.max_model_len)
    assert plugins.create_compactor(config.model_copy(update={"compaction": "none"})) is None


def test_summarize_asks_with_the_instruction_and_returns_the_summary_after_a_header() -> None:
    policy = ScriptedPolicy("  3 and 7 so far.  ")
    result = compact(Summarize(CONTEXT), long_episode(), policy)
    assert policy.asked == [[{"role": "user", "content": CONTEXT.instruction}]]
    assert result.history == [{"role": "user", "content": SUMMARY_HEADER + "3 and 7 so far."}]
    assert [r.text for r in result.replies] == ["  3 and 7 so far.  "]  # the reply is trained as generated


def test_summarize_fails_on_an_empty_or_cut_off_summary() -> None:
    with pytest.raises(CompactionFailed) as empty:
        compact(Summarize(CONTEXT), long_episode(), ScriptedPolicy("   "))
    assert empty.value.reason == "empty"

    class CutOff(ScriptedPolicy):
        async def reply(self, messages):  # type: ignore[no-untyped-def]
            reply = await super().reply(messages)
            from dataclasses import replace

            return replace(reply, turn=replace(reply.turn, finish_reason="length"))

    with pytest.raises(CompactionFailed) as cut:
        compact(Summarize(CONTEXT), long_episode(), CutOff())
    assert cut.value.reason == "overflow"


def test_drop_tool_outputs_replaces_the_tool_results_older_than_the_kept_turns() -> None:
    episode = long_episode(turns=4)
    result = compact(DropToolOutputs(CONTEXT), episode, ScriptedPolicy())
    assert [m["role"] for m in result.history] == [m["role"] for m in episode.history]
    tools = [m["content"] for m in result.history if m["role"] == "tool"]
    originals = [m["content"] for m in episode.history if m["role"] == "tool"]
    assert tools == [TOOL_OUTPUT_MARKER, TOOL_OUTPUT_MARKER, *originals[-2:]]
    assert [m for m in result.history if m["role"] == "assistant"] == [
        m for m in episode.history if m["role"] == "assistant"
    ]
    with pytest.raises(CompactionFailed):  # nothing older than the kept turns left to drop
        compact(DropToolOutputs(CONTEXT), EpisodeHistory(episode.prompt, result.history, 100), ScriptedPolicy())


def test_sliding_keeps_the_last_turns() -> None:
    episode = long_episode(turns=5)
    result = compact(Sliding(CONTEXT), episode, ScriptedPolicy())
    assert result.history == episode.history[-4:]  # 2 turns: an assistant message and its tool result each
    with pytest.raises(CompactionFailed):
        compact(Sliding(CONTEXT), EpisodeHistory(episode.prompt, episode.history[-4:], 100), ScriptedPolicy())


def test_a_working_limit_is_the_threshold_share_of_the_context() -> None:
    assert CompactionContext(max_model_len=1000, threshold=0.75).working_limit == 750

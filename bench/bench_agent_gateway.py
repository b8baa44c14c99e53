"""The agent gateway: prefix reuse, overhead per call, and calls/s at many concurrent episodes.

On the tiny test model (built locally), with the embedded engine's HTTP server in this
process (as ``telescope serve`` and a run's servers serve it):

1. **prompt tokens computed per call**, with the engine's prefix cache and without
   (``embedded_prefix_cache_tokens`` 16384 and 0): ``--episodes`` agent episodes of
   ``--calls`` calls each, every call sending the conversation so far (a system prompt,
   the user's question, then each earlier reply and a tool result), through the run's
   agent gateway; computed = the engine's prompt tokens less its ``prefix_cache_hits``;
2. **the gateway's overhead per call**: the median latency of a one-token chat call
   through ``telescope serve``'s gateway with the ``openai`` SDK, less that of the same
   prompt's one-token ``/v1/completions`` call straight to the engine's server with the
   orchestrator's client (``--repeats`` sequential calls each, after a warm-up);
3. **calls/s at ``--concurrent`` episodes** through the run's agent gateway (one process:
   the gateway, the episodes' programs and the engine's server share it).

Run from the repository root: ``python bench/bench_agent_gateway.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SYSTEM = "You are a careful assistant. Use the tools when they help. " * 4


def tiny_model(folder: Path) -> Path:
    from telescope.models.tiny import PRESETS, build_tiny_model

    return build_tiny_model(folder / "tiny", PRESETS["test"])


def start_engine(model: Path, prefix_tokens: int) -> tuple[Any, Any]:
    from telescope.inference.embedded.engine import Engine, EngineSettings
    from telescope.inference.embedded.server import ServerThread, create_app

    settings = EngineSettings(
        model_path=str(model), max_model_len=2048, max_num_seqs=64, prefix_cache_tokens=prefix_tokens
    )
    engine = Engine(settings).start()
    return engine, ServerThread(create_app(engine), host="127.0.0.1", port=0).start()


class Conversation:
    """An agent program: ``calls`` chat calls, each sending the whole conversation so far."""

    def __init__(self, calls: int) -> None:
        self.calls = calls

    async def run(self, client: Any, sample: Any) -> float:
        messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": str(sample.prompt)}]
        for turn in range(self.calls):
            reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
            messages.append({"role": "user", "content": f"tool result {turn}: {turn * 7 % 13}"})
        return 1.0


async def run_episodes(base_url: str, tokenizer: Any, episodes: int, calls: int, concurrent: int) -> tuple[int, float]:
    """``episodes`` episodes, ``concurrent`` at a time, through a run's agent gateway; (calls made, seconds)."""
    from telescope.api.agent import AgentEnvironment
    from telescope.api.records import Sample
    from telescope.inference.client import InferenceClient
    from telescope.inference.generation import Generation
    from telescope.orchestrator.agent_gateway import AgentGateway, run_agent_episode
    from telescope.orchestrator.rollouts import RolloutLimits

    program = Conversation(calls)

    class Env(AgentEnvironment):
        def load_dataset(self) -> list[Sample]:
            return []

        async def run(self, client: Any, sample: Sample) -> float:
            return await program.run(client, sample)

    client = InferenceClient(base_url)

    async def generate(prompt_ids: list[int], max_tokens: int, call: int) -> Generation:
        result = await client.complete(prompt_ids, max_tokens=max_tokens, temperature=1.0, seed=call)
        completion = result.completions[0]
        return Generation(completion.token_ids, completion.logprobs, "stop")

    gateway = await AgentGateway(tokenizer, chat_template=None, max_model_len=2048, model_name="policy").start()
    gate = asyncio.Semaphore(concurrent)

    async def one(index: int) -> int:
        async with gate:
            sample = Sample(prompt=f"question {index}: what is {index} + {index * 3}?", sample_id=str(index))
            rollout = await run_agent_episode(
                Env(),
                sample,
                gateway=gateway,
                generate=generate,
                policy_version=lambda: 0,
                limits=RolloutLimits(8, 2048),
            )
            assert rollout.error is None, rollout.error
            return len(rollout.agent_calls)

    t0 = time.perf_counter()
    made = sum(await asyncio.gather(*(one(i) for i in range(episodes))))
    seconds = time.perf_counter() - t0
    await gateway.close()
    await client.aclose()
    return made, seconds


def prompt_tokens_per_call(model: Path, tokenizer: Any, episodes: int, calls: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for label, tokens in (("with", 16384), ("without", 0)):
        engine, server = start_engine(model, tokens)
        made, _ = asyncio.run(run_episodes(server.base_url, tokenizer, episodes, calls, concurrent=8))
        computed = engine.stats["prompt_tokens"] - engine.stats["prefix_cache_hits"]
        out[label] = computed / made
        out[f"{label}_sent"] = engine.stats["prompt_tokens"] / made
        server.stop()
        engine.stop()
    return out


def gateway_overhead(model: Path, tokenizer: Any, repeats: int) -> tuple[float, float]:
    """(median ms of a direct one-token completion, median ms through the gateway's chat route)."""
    import openai

    from telescope.inference.client import InferenceClient
    from telescope.inference.embedded.server import ServerThread
    from telescope.inference.gateway.app import create_gateway_app
    from telescope.inference.gateway.service import Gateway

    engine, server = start_engine(model, 0)
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello there"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]

    async def connect() -> Gateway:
        return await Gateway.connect(InferenceClient(server.base_url), tokenizer)

    front = ServerThread(create_gateway_app(connect), lifespan="on").start()

    async def direct() -> list[float]:
        client = InferenceClient(server.base_url)
        times = []
        for i in range(repeats + 5):
            t0 = time.perf_counter()
            await client.complete(prompt_ids, max_tokens=1, temperature=1.0, seed=i)
            times.append(time.perf_counter() - t0)
        await client.aclose()
        return times[5:]

    direct_times = asyncio.run(direct())
    sdk = openai.OpenAI(base_url=front.base_url + "/v1", api_key="unused", max_retries=0)
    model_name = sdk.models.list().data[0].id
    chat_times = []
    for i in range(repeats + 5):
        t0 = time.perf_counter()
        sdk.chat.completions.create(model=model_name, messages=messages, max_tokens=1, seed=i)
        chat_times.append(time.perf_counter() - t0)
    sdk.close()
    front.stop()
    server.stop()
    engine.stop()
    return statistics.median(direct_times) * 1000, statistics.median(chat_times[5:]) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--concurrent", type=int, default=64)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as folder:
        model = tiny_model(Path(folder))
        tokenizer = AutoTokenizer.from_pretrained(model)
        reuse = prompt_tokens_per_call(model, tokenizer, args.episodes, args.calls)
        print(
            f"prompt tokens computed per call: {reuse['with']:.1f} with the prefix cache, "
            f"{reuse['without']:.1f} without ({reuse['with_sent']:.1f} sent per call)"
        )
        direct_ms, chat_ms = gateway_overhead(model, tokenizer, args.repeats)
        print(
            f"one-token call, median: direct /v1/completions {direct_ms:.2f} ms, gateway chat {chat_ms:.2f} ms: "
            f"overhead {chat_ms - direct_ms:.2f} ms"
        )
        engine, server = start_engine(model, 16384)
        episodes = args.concurrent * 2
        made, seconds = asyncio.run(run_episodes(server.base_url, tokenizer, episodes, args.calls, args.concurrent))
        print(f"{args.concurrent} concurrent episodes: {made / seconds:.1f} calls/s ({made} calls in {seconds:.1f} s)")
        server.stop()
        engine.stop()


if __name__ == "__main__":
    main()

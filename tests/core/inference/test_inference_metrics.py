"""The embedded server's /metrics as the run's scraper reads them: vLLM's names, histograms, rates."""

from __future__ import annotations

import asyncio
from typing import Any

from telescope.inference.client import InferenceClient
from telescope.recording.infra_monitor import InferenceMetricsScraper


def test_scraping_the_embedded_server(server: Any, engine: Any) -> None:
    async def go() -> list[dict[str, Any]]:
        async with InferenceClient(server.base_url) as client:
            scraper = InferenceMetricsScraper(0, client.metrics, client.base_url)
            before = await scraper()
            prompts = ([5, 6, 7, 8], [9, 6, 7, 8], [5, 6, 7, 9])  # different: none shares a prefill
            await asyncio.gather(*(client.complete(p, max_tokens=6, ignore_eos=True) for p in prompts))
            metrics = await client.metrics()
            after = await scraper()
        return [*before, *after, metrics]

    before, after, metrics = asyncio.run(go())
    for name in (
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_sum",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:request_success_total",
    ):
        assert name in metrics, name
    assert metrics["vllm:prefix_cache_hits_total"] == 0.0  # no two prompts alike
    assert metrics["vllm:prefix_cache_queries_total"] == metrics["vllm:prompt_tokens_total"] == 12
    # one first token per request, then 5 inter-token gaps per 6-token sequence (a fresh engine in this module)
    assert metrics["vllm:time_to_first_token_seconds_count"] == 3
    assert metrics["vllm:inter_token_latency_seconds_count"] == 15
    assert metrics[f"vllm:time_to_first_token_seconds_bucket{{le=+Inf,model_name={engine.settings.model_path}}}"] >= 3
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == 18
    assert after["generation_tokens_per_s"] > 0 and after["prompt_tokens_per_s"] > 0
    assert after["ttft_mean_s"] > 0 and after["itl_mean_s"] > 0
    assert after["prefix_cache_hit_rate"] == 0.0
    assert {"requests_running", "requests_waiting", "kv_cache_usage", "policy_version"} <= set(after)

"""``telescope serve MODEL_OR_CHECKPOINT``: an OpenAI-compatible endpoint on a model or checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import click


@click.command(name="serve")
@click.argument("source", metavar="MODEL_OR_CHECKPOINT")
@click.option(
    "--backend",
    type=click.Choice(["embedded", "vllm"]),
    default="embedded",
    show_default=True,
    help="Inference backend (vllm needs a CUDA GPU and pip install 'telescope-core[vllm]').",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the gateway binds.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Gateway port (0: any free port; the URL is printed).",
)
@click.option(
    "--max-model-len",
    type=click.IntRange(16),
    default=None,
    help="Context length, prompt + completion tokens (default: the model's max_position_embeddings).",
)
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default="float32", show_default=True)
@click.option(
    "--max-concurrent-requests",
    type=click.IntRange(1),
    default=64,
    show_default=True,
    help="Calls in flight at once; more are answered 429.",
)
@click.option(
    "--api-key",
    envvar="TELESCOPE_API_KEY",
    default=None,
    help="Require Authorization: Bearer KEY (default: $TELESCOPE_API_KEY; none: no check).",
)
@click.option(
    "--tool-parser",
    type=click.Choice(["auto", "hermes", "none"]),
    default="auto",
    show_default=True,
    help="Tool-call format of the model (auto: from its chat template).",
)
@click.option(
    "--chat-template",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A Jinja2 chat template file to use instead of the tokenizer's.",
)
def serve_command(
    source: str,
    backend: str,
    host: str,
    port: int,
    max_model_len: int | None,
    dtype: Literal["float32", "float16", "bfloat16"],
    max_concurrent_requests: int,
    api_key: str | None,
    tool_parser: str,
    chat_template: Path | None,
) -> None:
    """Serve MODEL_OR_CHECKPOINT behind an OpenAI-compatible API until stopped (Ctrl-C, SIGTERM).

    MODEL_OR_CHECKPOINT is a tiny:<preset> model, a Hugging Face model folder, a checkpoint
    folder, or a run directory (its latest checkpoint). Point an OpenAI client at the printed
    base URL: /v1/chat/completions, /v1/completions, /v1/models.
    """
    from telescope.cli.main import UserError
    from telescope.runtime.serve import ServeOptions, model_folder, serve

    try:
        model_folder(source)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    options = ServeOptions(
        source=source,
        backend=backend,
        host=host,
        port=port,
        max_model_len=max_model_len,
        dtype=dtype,
        max_concurrent_requests=max_concurrent_requests,
        api_key=api_key,
        tool_parser=tool_parser,
        chat_template=chat_template.read_text(encoding="utf-8") if chat_template is not None else None,
    )
    try:
        serve(options, announce=lambda url: click.echo(f"serving {source} at {url}", err=False))
    except OSError as exc:
        raise UserError(f"cannot serve on {host}:{port}: {exc}") from None
    except (RuntimeError, TimeoutError) as exc:  # the backend could not start (its message says why)
        raise UserError(f"the {backend} backend did not start: {exc}") from None
    click.echo("stopped", err=True)

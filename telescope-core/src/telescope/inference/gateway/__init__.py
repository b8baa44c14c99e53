"""The OpenAI-compatible gateway: chat, completions and models over any inference backend.

An agent program written against the OpenAI API (the ``openai`` SDK, the Agents SDK)
points its base URL at the gateway; the gateway renders messages with the model's chat
template, sends token ids to the backend server through the orchestrator's own
:class:`~telescope.inference.client.InferenceClient` (the embedded engine and vLLM take
the same path) and turns the completion back into OpenAI's shapes.

- :mod:`.service`: :class:`~.service.Gateway` and its one call, where recording hooks in;
- :mod:`.chat`: messages and tools -> prompt ids, replies -> content and tool calls;
- :mod:`.tool_parsers`: the tool-call formats (``hermes``), pluggable per model;
- :mod:`.schema`: the accepted request bodies; :mod:`.responses`: bodies and streams;
- :mod:`.errors`: OpenAI's error JSON; :mod:`.app`: the routes.

``telescope serve`` runs a backend and the gateway on a model or checkpoint.
"""

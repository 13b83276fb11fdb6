"""The recording proxy (OpenForge RL's agent traffic): an OpenAI-compatible server between an agent and its
model endpoint that forwards every call unchanged and records it as training data.

The app, one concern per module:
- app:         the ASGI app (Starlette): routes, the hot path's dispatch, session events, health, the lifespan.
- guards:      what a call passes before it is sent on: the door, the access token, session names and the
               session tree, the body.
- forward:     a call sent on as the client sent it: the headers that go upstream (keys), the answer checked
               against its wire, a stream relayed chunk by chunk.
- translating: a Messages or Responses call served through a chat-only upstream (proxy.translate).
- calls:       one call's request, reply and bookkeeping, finished into one record and one ledger row.
- state:       the process's state: settings, record log, ledger, prices, session tree, refusal budget.
- upstream:    where calls go, with which operator key, and the HTTP client (pooled connections, the one retry).
What is recorded, per wire API:
- sse:         the one event-stream (SSE) parser of the three APIs (and how an event is written), the proxy's JSON.
- recording:   what is kept of a chat call: request content, response reassembled from SSE chunks if streamed.
- wires:       the three recorded APIs (chat, Responses, Messages): request and response parts, form checks,
               ledger usage, stream reassembly and end.
Translation for a chat-only upstream (proxy.translate), by client API:
- translate:            what both share: the translated request, the chat reply's tool calls and usage, the
                        chat stream re-emitted in the client's API.
- translate_messages:   Messages API requests as chat completions, and chat replies and streams as Messages.
- translate_responses:  Responses API requests as chat completions (previous_response_id history), and chat
                        replies and streams as Responses.
Running it:
- server:     `evolforge proxy` as a long-running service (uvicorn through tasks/core/serving.py, no Prefect), in a
              thread, and --check.
- banner:     what `evolforge proxy` prints at start: each client's base URL, session and token settings.
Records go through storage/proxy_sets.py; the trajectories stage turns them into SFT and RL samples.
"""

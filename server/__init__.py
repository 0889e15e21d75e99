"""pegmask.server: the HTTP app over one `Engine` (`pegmask serve`).

    from pegmask.server import ServerConfig, create_app
    app = create_app(Engine(), ServerConfig(api_key="sk-local"))

One module per API surface, each with its own request parsing and response shapes
(`openai_chat`: Chat Completions and Completions; `openai_responses`; `anthropic_messages`),
over the shared `gateway` (body, model name, auth, limits, the engine hand-off), `errors` (each
API's error shape) and `sse` (event-stream framing).
"""

from pegmask.server.app import create_app
from pegmask.server.gateway import ServerConfig

__all__ = ["ServerConfig", "create_app"]

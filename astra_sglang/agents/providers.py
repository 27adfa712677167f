"""Model providers: OpenAI, OpenAI-compatible chat-completions servers (SGLang, vLLM, ...), and
the scripted model. Every model the agents get is wrapped in `MeteredModel`, which checks the
budget before each request and records the usage after it.

Model, endpoint and key come from flags or the environment (OPENAI_API_KEY, OPENAI_BASE_URL); the
key is handed to the redactor at once and never logged.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional
from urllib.parse import urlsplit

from ..errors import AstraError
from .budget import Meter
from .runlog import Redactor

OPENAI_HOST = "api.openai.com"


@dataclass
class ProviderSpec:
    kind: str  # "openai" | "compatible" | "scripted"
    model: str
    base_url: Optional[str] = None
    api_key: Optional[str] = None  # never logged
    strict_schema: bool = True
    script: Optional[Path] = None

    @property
    def endpoint(self) -> str:
        return self.base_url or f"https://{OPENAI_HOST}/v1"

    def public(self, redactor: Redactor) -> Dict[str, Any]:
        d = {"kind": self.kind, "model": self.model, "strict_schema": self.strict_schema}
        if self.kind != "scripted":
            d["endpoint"] = redactor.text(self.endpoint)
        if self.script:
            d["script"] = str(self.script)
        return d


def resolve(model: Optional[str], base_url: Optional[str], api_key: Optional[str],
            strict_schema: Optional[bool], redactor: Redactor) -> ProviderSpec:
    """Turn flags + environment into a provider, or one clear error."""
    if not model:
        raise AstraError(
            "no model configured: pass --model NAME (e.g. --model o4-mini with OPENAI_API_KEY set; "
            "--base-url http://HOST:PORT/v1 --model NAME for an OpenAI-compatible server; "
            "or --model scripted:FILE to replay a script)")
    if model.startswith("scripted:"):
        path = Path(model.split(":", 1)[1]).expanduser()
        if not path.is_file():
            raise AstraError(f"script {path} does not exist (--model scripted:FILE)")
        return ProviderSpec("scripted", "scripted", script=path,
                            strict_schema=bool(strict_schema) if strict_schema is not None else False)
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    key = api_key or os.environ.get("OPENAI_API_KEY") or None
    redactor.add(key)
    if base_url:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise AstraError(f"--base-url {redactor.text(base_url)!r} is not an http(s) URL (e.g. http://localhost:30000/v1)")
        if parts.password:
            redactor.add(parts.password)
    official = not base_url or urlsplit(base_url).hostname == OPENAI_HOST
    if official and not key:
        raise AstraError("no API key for OpenAI: set OPENAI_API_KEY or pass --api-key "
                         "(or --base-url for a local server that needs none)")
    kind = "openai" if official else "compatible"
    strict = strict_schema if strict_schema is not None else official
    return ProviderSpec(kind, model, base_url, key or "EMPTY", strict)


def map_error(exc: BaseException, spec: ProviderSpec) -> Optional[AstraError]:
    """A provider failure as one line; None when `exc` is not a provider failure."""
    try:
        import openai
    except ImportError:
        return None
    where = spec.endpoint
    if isinstance(exc, openai.APITimeoutError):
        return AstraError(f"the model endpoint {where} timed out")
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f": {cause}" if cause else ""
        return AstraError(f"cannot reach the model endpoint {where}{detail}")
    if isinstance(exc, openai.AuthenticationError):
        return AstraError(f"the model endpoint {where} rejected the API key (401)")
    if isinstance(exc, openai.PermissionDeniedError):
        return AstraError(f"the model endpoint {where} refused access with this API key (403)")
    if isinstance(exc, openai.NotFoundError):
        return AstraError(f"model {spec.model!r} not found at {where} (404)")
    if isinstance(exc, openai.RateLimitError):
        return AstraError(f"the model endpoint {where} is rate-limiting or the quota is spent (429): {_msg(exc)}")
    if isinstance(exc, openai.APIStatusError):
        return AstraError(f"the model endpoint {where} answered {exc.status_code}: {_msg(exc)}")
    return None


def _msg(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
    return str(getattr(exc, "message", exc))[:300]


class Provider:
    """Builds one SDK model per agent role and runs the agents on one event loop."""

    def __init__(self, spec: ProviderSpec, meter: Meter, redactor: Redactor) -> None:
        from . import sdk

        sdk.require()
        self.spec = spec
        self.meter = meter
        self.redactor = redactor
        self.loop = asyncio.new_event_loop()
        self._client = None
        self.script = None
        if spec.kind == "scripted":
            from .scripted import Script

            self.script = Script(spec.script)

    def close(self) -> None:
        """Finish what an interruption left on the loop (quietly), close the client and the loop."""
        tasks = [t for t in asyncio.all_tasks(self.loop)]
        for t in tasks:
            if t.done():
                if not t.cancelled():
                    t.exception()  # retrieved: no "exception was never retrieved" at exit
            else:
                t.cancel()
        pending = [t for t in tasks if not t.done()]
        try:
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            if self._client is not None:
                self.loop.run_until_complete(self._client.close())
        except BaseException:
            pass
        self.loop.close()

    @property
    def client(self):
        if self._client is None:
            from openai import AsyncOpenAI

            self._client = AsyncOpenAI(api_key=self.spec.api_key, base_url=self.spec.base_url, max_retries=2,
                                       timeout=600.0)
        return self._client

    def set_round(self, r: int) -> None:
        if self.script is not None:
            self.script.set_round(r)

    def preflight(self) -> None:
        """Reach the endpoint once before the loop starts: wrong URL, key or model fail here."""
        if self.spec.kind == "scripted":
            return
        import openai

        try:
            if self.spec.kind == "openai":
                self.loop.run_until_complete(self.client.models.retrieve(self.spec.model))
                return
            page = self.loop.run_until_complete(self.client.models.list())
            served = [m.id for m in getattr(page, "data", [])]
        except openai.NotFoundError:
            if self.spec.kind == "openai":
                raise AstraError(f"model {self.spec.model!r} not found at {self.spec.endpoint} (404)")
            return  # a server without /models: the first request will tell
        except Exception as e:
            mapped = map_error(e, self.spec)
            if mapped:
                raise mapped from None
            raise
        if served and self.spec.model not in served:
            raise AstraError(f"model {self.spec.model!r} is not served at {self.spec.endpoint} "
                             f"(it serves: {', '.join(served[:8])})")

    def model(self, role: str):
        if self.spec.kind == "scripted":
            from .scripted import ScriptedModel

            inner = ScriptedModel(self.script, role)
        else:
            from agents import OpenAIChatCompletionsModel

            inner = OpenAIChatCompletionsModel(model=self.spec.model, openai_client=self.client)
        return metered(inner, self.meter)


def metered(inner, meter: Meter):
    from agents.models.interface import Model

    class MeteredModel(Model):
        """Budget check before each request, usage recorded after it."""

        def __init__(self) -> None:
            self.inner = inner

        async def get_response(self, *args, **kwargs):
            meter.check()
            resp = await self.inner.get_response(*args, **kwargs)
            u = getattr(resp, "usage", None)
            meter.record(getattr(u, "input_tokens", 0) or 0, getattr(u, "output_tokens", 0) or 0,
                         getattr(u, "requests", 1) or 1)
            return resp

        def stream_response(self, *args, **kwargs):
            raise NotImplementedError("the optimize loop does not stream")

    return MeteredModel()

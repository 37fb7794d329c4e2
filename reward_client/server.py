"""Reference reward service: ``python -m reward_client.server --host 127.0.0.1 --port P --token T``.

Same endpoints and formats as the cosmos-rl reward service (shared/specs/reward_protocol.md),
serving the local rewards of ``reward_client.registry``. Unlike that service it checks the Bearer
token (401), refuses bodies over ``--max-body-mb`` (413), answers 503 when its bounded queue is
full (never a silent drop), keeps results until pulled or ``--ttl-s`` after completion, answers
404 for unknown/expired uuids and 422 (with the reason) for a reward that failed.
With ``--pipeline DIR`` (a diffusers pipeline dir with a Wan2.1 ``vae/``) it also takes
media_type "latent": float VAE latents [B,C,T,h,w], as cosmos-rl's video trainer sends them,
decoded to uint8 videos (reward_client.latents) and scored as media_type "video"; without it a
latent payload is answered 422. media_type "text" (completions, wfm_jax's extension; protocol.py)
is scored by the text rewards; an enqueue asking a reward of the other media is answered 422.
Needs the ``server`` extra (fastapi, uvicorn).
"""

import argparse
import hmac
import json
import math
import os
import sys
from contextlib import asynccontextmanager

import numpy as np

from reward_client import protocol
from reward_client.catalog import available_rewards, get_reward, is_local, score_local
from reward_client.errors import RewardError, RewardProtocolError
from reward_client.task_store import QueueFull, TaskStore

DRAIN_CAP_BYTES = 64 << 20  # read (and discard) this much of a refused body so the client sees the answer


def _null_nonfinite(value):
    """NaN/inf -> None: a bare NaN token is not JSON and strict parsers refuse the whole answer;
    null reaches the client, which rejects those samples by name."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _null_nonfinite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_null_nonfinite(v) for v in value]
    return value


def _json(status: int, content):
    from starlette.responses import Response

    return Response(json.dumps(_null_nonfinite(content), allow_nan=False), status_code=status,
                    media_type="application/json")


def local_scorer(max_video_frames: int):
    def score(name: str, header: dict, media: np.ndarray) -> dict:
        extras = {k: v for k, v in header.items() if k not in protocol.RESERVED_HEADER_KEYS}
        scores = score_local(name, media, header["prompts"], media_type=header["media_type"],
                             extras=extras, max_video_frames=max_video_frames)
        return {k: [float(x) for x in v] for k, v in scores.items()}
    return score


def media_mismatch(names, media_type: str) -> str | None:
    """Why these rewards cannot score this payload (text rewards take media_type "text", the
    others pixels), or None: refused at enqueue, so no reward is ever computed on the wrong media."""
    text = media_type == "text"
    wrong = [n for n in names if (get_reward(n).media == "text") != text]
    if not wrong:
        return None
    want = "media_type 'text' (completions)" if not text else "images, videos or latents"
    return (f"rewards {wrong} cannot score a media_type {media_type!r} payload: they score {want}; "
            f"send them in their own enqueue")


def decode_latents_with(decoder):
    """TaskStore prepare step: a latent payload -> the uint8 video batch it decodes to."""
    def prepare(header: dict, media: np.ndarray):
        if header["media_type"] != "latent":
            return header, media
        return dict(header, media_type="video"), decoder(media)
    return prepare


def create_app(token: str | None, *, max_body_bytes: int = 512 << 20, max_queue: int = 64,
               ttl_s: float = 3600.0, workers: int = 1, max_video_frames: int = 4, scorer=None,
               decoder=None):
    """FastAPI app. ``token=None`` disables auth (only for tests of foreign clients).
    decoder: a reward_client.latents.LatentDecoder for latent payloads (None: refused)."""
    from fastapi import FastAPI, Request

    store = TaskStore(scorer or local_scorer(max_video_frames), max_queue=max_queue, ttl_s=ttl_s,
                      workers=workers,
                      prepare=decode_latents_with(decoder) if decoder is not None else None)

    @asynccontextmanager
    async def lifespan(app):
        store.start()
        yield
        store.stop()

    app = FastAPI(title="wfm_jax reference reward service", lifespan=lifespan)
    app.state.store = store

    async def drain(request: Request) -> None:
        seen = 0
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > DRAIN_CAP_BYTES:
                return

    async def refuse(request: Request, status: int, detail: str):
        await drain(request)
        return _json(status, {"detail": detail})

    def authorised(request: Request) -> bool:
        if token is None:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    async def read_body(request: Request) -> bytes | None:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body_bytes:
            return None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    def too_large(what: str):
        return f"{what} body exceeds the server limit of {max_body_bytes} bytes"

    @app.post(protocol.ENQUEUE_PATH)
    async def enqueue(request: Request):
        from starlette.concurrency import run_in_threadpool

        if not authorised(request):
            return await refuse(request, 401, "missing or wrong bearer token")
        body = await read_body(request)
        if body is None:
            return await refuse(request, 413, too_large("enqueue"))
        try:
            header, media = await run_in_threadpool(protocol.decode_enqueue, body)
        except RewardProtocolError as exc:
            return _json(422, {"detail": str(exc)})
        if header["media_type"] == "latent":
            if decoder is None:
                return _json(422, {"detail": "this reward server has no VAE to decode latents: start "
                                             "it with --pipeline DIR (a Wan2.1 pipeline dir) or send "
                                             "uint8 images [B,H,W,C] or videos [B,C,T,H,W]"})
            try:
                decoder.check(media)
            except RewardProtocolError as exc:
                return _json(422, {"detail": str(exc)})
        names = [n for n, w in header["reward_fn"].items() if w > 0]
        unknown = [n for n in names if not is_local(n)]
        if unknown or not names:
            return _json(422, {"detail": f"rewards {unknown or 'none with weight > 0'} not served; "
                                         f"served: {available_rewards()}"})
        mismatch = media_mismatch(names, header["media_type"])
        if mismatch:
            return _json(422, {"detail": mismatch})
        try:
            uuid = store.submit(header, media, names)
        except QueueFull as exc:
            return _retry_later(str(exc))
        return _json(200, {"uuid": uuid})

    @app.post(protocol.PULL_PATH)
    async def pull(request: Request):
        if not authorised(request):
            return await refuse(request, 401, "missing or wrong bearer token")
        body = await read_body(request)
        if body is None:
            return await refuse(request, 413, too_large("pull"))
        try:
            form = {**dict(request.query_params), **protocol.parse_form(body)}
        except RewardProtocolError as exc:
            return _json(422, {"detail": str(exc)})
        if not form.get("uuid") or not form.get("type"):
            return _json(422, {"detail": "pull needs form fields 'uuid' and 'type'"})
        state, value = store.pull(form["uuid"], form["type"])
        if state == "ready":
            return _json(200, value)
        if state == "pending":
            return _json(400, {"detail": "not ready"})
        return _json(422 if state == "failed" else 404, {"detail": value})

    @app.post(protocol.PING_PATH)
    async def ping(request: Request):
        if not authorised(request):
            return await refuse(request, 401, "missing or wrong bearer token")
        await drain(request)  # info_data is accepted and ignored
        return _json(200, {"status": "ok", "rewards": available_rewards(), **store.counts()})

    return app


def _retry_later(detail: str):
    response = _json(503, {"detail": detail})
    response.headers["Retry-After"] = "1"
    return response


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reward_client.server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--token", default=None, help="bearer token (default: $REMOTE_REWARD_TOKEN)")
    parser.add_argument("--max-body-mb", type=float, default=512.0)
    parser.add_argument("--max-queue", type=int, default=64)
    parser.add_argument("--ttl-s", type=float, default=3600.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-video-frames", type=int, default=4)
    parser.add_argument("--pipeline", default=None,
                        help="diffusers pipeline dir whose Wan2.1 vae/ decodes media_type 'latent'")
    args = parser.parse_args(argv)
    token = args.token or os.environ.get("REMOTE_REWARD_TOKEN")
    if not token:
        print("error: no token: pass --token or set REMOTE_REWARD_TOKEN", file=sys.stderr)
        return 2
    try:
        import uvicorn
    except ImportError:
        print("error: the reward server needs fastapi and uvicorn: pip install 'wfm_jax[server]'",
              file=sys.stderr)
        return 2
    try:
        decoder = None
        if args.pipeline:
            from reward_client.latents import LatentDecoder
            decoder = LatentDecoder(args.pipeline)
        app = create_app(token, max_body_bytes=int(args.max_body_mb * 2**20), max_queue=args.max_queue,
                         ttl_s=args.ttl_s, workers=args.workers, max_video_frames=args.max_video_frames,
                         decoder=decoder)
    except RewardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"reward server on http://{args.host}:{args.port}: POST {protocol.ENQUEUE_PATH}, "
          f"POST {protocol.PULL_PATH}, POST {protocol.PING_PATH} (Bearer token); rewards: "
          f"{', '.join(available_rewards())}"
          + (f"; latents decoded with the VAE of {args.pipeline}" if args.pipeline else ""), flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())

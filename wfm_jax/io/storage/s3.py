"""S3 credentials, endpoint and client (boto3), shared by the data source and the checkpoint
mirror.

Each setting is read from cosmos-rl's variable first, then the standard AWS one (empty counts as
unset, as cosmos-rl defaults them to ""):

    access key   PROD_S3_CHECKPOINT_ACCESS_KEY_ID      AWS_ACCESS_KEY_ID
    secret key   PROD_S3_CHECKPOINT_SECRET_ACCESS_KEY  AWS_SECRET_ACCESS_KEY
    endpoint     PROD_S3_CHECKPOINT_ENDPOINT_URL       AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL
    region       PROD_S3_CHECKPOINT_REGION_NAME        AWS_REGION, AWS_DEFAULT_REGION (us-east-1)

The endpoint is required: nothing is sent to a public cloud because a variable was forgotten.
Errors are one line naming the variable to fix; the secret is never printed.
"""
from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping

from wfm_jax.core.errors import UserError

_SETTINGS = {  # field -> variables, in order of preference
    "access_key": ("PROD_S3_CHECKPOINT_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
    "secret_key": ("PROD_S3_CHECKPOINT_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
    "endpoint_url": ("PROD_S3_CHECKPOINT_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "region": ("PROD_S3_CHECKPOINT_REGION_NAME", "AWS_REGION", "AWS_DEFAULT_REGION"),
}
_REQUIRED = ("endpoint_url", "access_key", "secret_key")


class S3Error(UserError, RuntimeError):
    """S3 cannot be used as configured (credentials, endpoint, bucket, server); one line."""


@dataclasses.dataclass(frozen=True)
class S3Config:
    endpoint_url: str
    access_key: str
    secret_key: str = dataclasses.field(repr=False)
    region: str = "us-east-1"
    session_token: str | None = dataclasses.field(default=None, repr=False)
    # the variable each value came from, for error messages: (("access_key", "AWS_..."), ...)
    sources: tuple = dataclasses.field(default=(), compare=False, repr=False)

    def source(self, field: str) -> str:
        return dict(self.sources).get(field, " / ".join(_SETTINGS[field]))


def s3_config_from_env(env: Mapping[str, str] | None = None) -> S3Config:
    """The S3 settings from the environment, or S3Error naming every missing variable."""
    env = os.environ if env is None else env
    values, sources, missing = {}, {}, []
    for field, names in _SETTINGS.items():
        name = next((n for n in names if env.get(n, "").strip()), None)
        if name is None:
            if field in _REQUIRED:
                missing.append(" or ".join(names))
            continue
        values[field], sources[field] = env[name].strip(), name
    if missing:
        raise S3Error(f"s3:// needs credentials and an explicit endpoint; set {'; '.join(missing)}")
    endpoint = values["endpoint_url"]
    if not endpoint.startswith(("http://", "https://")):
        raise S3Error(f"{sources['endpoint_url']}='{endpoint}' is not an http(s):// URL")
    return S3Config(endpoint_url=endpoint, access_key=values["access_key"],
                    secret_key=values["secret_key"], region=values.get("region", "us-east-1"),
                    session_token=env.get("AWS_SESSION_TOKEN") or None,
                    sources=tuple(sorted(sources.items())))


def is_s3_url(path) -> bool:
    return isinstance(path, str) and path.startswith("s3://")


def split_url(url: str) -> tuple[str, str]:
    """'s3://bucket/a/b' -> ('bucket', 'a/b'); the key may be empty."""
    if not is_s3_url(url) or not url[5:].split("/", 1)[0]:
        raise S3Error(f"'{url}' is not an s3://bucket/key URL")
    bucket, _, key = url[5:].partition("/")
    return bucket, key


_CLIENTS: dict = {}
_LOCK = threading.Lock()


def client(cfg: S3Config, attempts: int = 5):
    """One boto3 client per process and config (creating one costs ~50 ms; clients are
    thread-safe, and a forked grain worker gets its own)."""
    import boto3
    from botocore.config import Config
    key = (os.getpid(), cfg, attempts)
    with _LOCK:
        if key not in _CLIENTS:
            _CLIENTS[key] = boto3.session.Session().client(
                "s3", endpoint_url=cfg.endpoint_url, region_name=cfg.region,
                aws_access_key_id=cfg.access_key, aws_secret_access_key=cfg.secret_key,
                aws_session_token=cfg.session_token,
                config=Config(s3={"addressing_style": "path"}, connect_timeout=10,
                              read_timeout=60, retries={"max_attempts": attempts, "mode": "standard"},
                              max_pool_connections=32))
        return _CLIENTS[key]


def explain(e: BaseException, cfg: S3Config, what: str, bucket: str = "") -> S3Error:
    """An S3Error with one line for a botocore failure of `what` (e.g. "reading s3://b/k")."""
    from botocore.exceptions import ClientError, ConnectTimeoutError, EndpointConnectionError
    if isinstance(e, ClientError):
        code = e.response.get("Error", {}).get("Code", "")
        if code == "InvalidAccessKeyId":
            return S3Error(f"{what}: the S3 server does not know the access key "
                           f"(check {cfg.source('access_key')})")
        if code == "SignatureDoesNotMatch":
            return S3Error(f"{what}: the S3 server rejected the secret key "
                           f"(check {cfg.source('secret_key')})")
        if code in ("AccessDenied", "403"):
            return S3Error(f"{what}: access denied (check {cfg.source('access_key')} and "
                           f"{cfg.source('secret_key')})")
        if code == "NoSuchBucket":
            return S3Error(f"{what}: bucket '{bucket}' does not exist at {cfg.endpoint_url}")
        if code in ("NoSuchKey", "404"):
            return S3Error(f"{what}: no such object")
        return S3Error(f"{what}: {code}: {e.response.get('Error', {}).get('Message', '')}")
    # boto3's transfer manager wraps the connection error in S3UploadFailedError: match its text
    if isinstance(e, (EndpointConnectionError, ConnectTimeoutError)) or \
            "Could not connect to the endpoint" in str(e):
        return S3Error(f"{what}: cannot reach the S3 endpoint {cfg.endpoint_url} "
                       f"(check {cfg.source('endpoint_url')})")
    return S3Error(f"{what}: {type(e).__name__}: {e}")

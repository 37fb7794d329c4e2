"""The S3 test server and the credential / endpoint handling (wfm_jax.io.storage.s3), against the
real server: a missing variable, a wrong key or secret, an unreachable endpoint and a missing
bucket each give one line naming what to fix."""
from __future__ import annotations

import pytest

from wfm_jax.io.storage import s3 as s3lib


def test_server_round_trip(s3_server, s3_bucket):
    cfg = s3lib.s3_config_from_env()
    assert cfg.endpoint_url == s3_server.endpoint and cfg.endpoint_url.startswith("http://127.0.0.1:")
    c = s3lib.client(cfg)
    c.put_object(Bucket=s3_bucket, Key="a/b.txt", Body=b"hello")
    assert c.get_object(Bucket=s3_bucket, Key="a/b.txt", Range="bytes=1-3")["Body"].read() == b"ell"


def test_aws_fallback_and_precedence(s3_server):
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "topsecret9",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:1", "PROD_S3_CHECKPOINT_ACCESS_KEY_ID": "",
           "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:2", "AWS_DEFAULT_REGION": "eu-west-1"}
    cfg = s3lib.s3_config_from_env(env)
    assert (cfg.access_key, cfg.endpoint_url, cfg.region) == ("k", "http://127.0.0.1:2", "eu-west-1")
    assert cfg.source("access_key") == "AWS_ACCESS_KEY_ID"
    env["PROD_S3_CHECKPOINT_ACCESS_KEY_ID"] = "p"
    assert s3lib.s3_config_from_env(env).access_key == "p"
    assert "topsecret9" not in repr(cfg)


@pytest.mark.parametrize("drop, named", [
    ("ENDPOINT_URL", "PROD_S3_CHECKPOINT_ENDPOINT_URL or AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL"),
    ("SECRET_ACCESS_KEY", "PROD_S3_CHECKPOINT_SECRET_ACCESS_KEY or AWS_SECRET_ACCESS_KEY")])
def test_missing_variable_is_named(s3_server, drop, named):
    env = {k: v for k, v in s3_server.env.items() if not k.endswith(drop)}
    with pytest.raises(s3lib.S3Error) as e:
        s3lib.s3_config_from_env(env)
    assert named in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("var, value, named", [
    ("PROD_S3_CHECKPOINT_ACCESS_KEY_ID", "nobody", "PROD_S3_CHECKPOINT_ACCESS_KEY_ID"),
    ("PROD_S3_CHECKPOINT_SECRET_ACCESS_KEY", "wrong", "PROD_S3_CHECKPOINT_SECRET_ACCESS_KEY"),
    ("PROD_S3_CHECKPOINT_ENDPOINT_URL", "http://127.0.0.1:9", "PROD_S3_CHECKPOINT_ENDPOINT_URL")])
def test_wrong_credentials_are_named(s3_server, s3_bucket, var, value, named):
    cfg = s3lib.s3_config_from_env({**s3_server.env, var: value})
    with pytest.raises(Exception) as e:
        s3lib.client(cfg, attempts=1).head_bucket(Bucket=s3_bucket)
    err = s3lib.explain(e.value, cfg, f"reading s3://{s3_bucket}", s3_bucket)
    assert named in str(err) and "\n" not in str(err), str(err)
    assert "wfmtestsecret" not in str(err) and "wrong" not in str(err)


def test_missing_bucket_is_named(s3_server, s3_bucket):
    cfg = s3lib.s3_config_from_env()
    with pytest.raises(Exception) as e:
        s3lib.client(cfg).list_objects_v2(Bucket="no-such-bucket-x")
    err = s3lib.explain(e.value, cfg, "listing s3://no-such-bucket-x/", "no-such-bucket-x")
    assert "bucket 'no-such-bucket-x' does not exist" in str(err)

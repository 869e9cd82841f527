"""The ingest baseline: the same ASGI stack (uvicorn + uvloop + httptools + Starlette) with
an endpoint that only parses the events and appends them to a file, one per line.

No keys, no enrichment, no limits, no fsync: the floor eventpipe's collector is compared to.
"""

from __future__ import annotations

import argparse
import socket

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def make_app(out_path: str) -> Starlette:
    out = open(out_path, "ab")  # noqa: SIM115 - open for the life of the server

    async def ingest(request: Request) -> Response:
        document = orjson.loads(await request.body())
        items = document if isinstance(document, list) else [document]
        out.write(b"".join(orjson.dumps(i, option=orjson.OPT_APPEND_NEWLINE) for i in items))
        return Response(b'{"status":"ok"}', media_type="application/json")

    return Starlette(routes=[Route("/api/v1/s2s/event", ingest, methods=["POST"])])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--reuse-port", action="store_true",
                        help="share the port with other processes (SO_REUSEPORT)")  # fmt: skip
    args = parser.parse_args()
    config = uvicorn.Config(
        make_app(args.out),
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        server_header=False,
    )
    sockets = None
    if args.reuse_port:  # a TCP socket of its own, as eventpipe's workers have
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", args.port))
        sock.listen(2048)
        sockets = [sock]
    uvicorn.Server(config).run(sockets=sockets)


if __name__ == "__main__":
    main()

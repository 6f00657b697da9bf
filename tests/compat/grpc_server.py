#!/usr/bin/env python3
"""A gRPC server over TLS for the compat suite (inside the test's namespace): one unary method,
/compat.Echo/Say, answering its request bytes prefixed with "echo: ". No generated code: the
generic handler takes and returns raw bytes.

Usage: grpc_server.py ADDR:PORT CERT KEY
"""
import sys
import time

import grpc


def say(request, context):
    return b"echo: " + request


if __name__ == "__main__":
    target, cert, key = sys.argv[1:4]
    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(4))
    handler = grpc.method_handlers_generic_handler(
        "compat.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)}
    )
    server.add_generic_rpc_handlers((handler,))
    creds = grpc.ssl_server_credentials([(open(key, "rb").read(), open(cert, "rb").read())])
    server.add_secure_port(target, creds)
    server.start()
    print("ready", flush=True)
    while True:
        time.sleep(3600)

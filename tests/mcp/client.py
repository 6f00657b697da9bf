"""The official Python SDK's MCP client, as an agent runs it: through the proxy named by
HTTP_PROXY, it opens a session at URL, lists the tools, then calls each tool given as
NAME=JSON_ARGS in order. With `--sse` first, the older HTTP+SSE transport (URL is the
SSE endpoint). Prints one JSON object: the tools listed and each call's outcome
(its text, or the JSON-RPC error's code and message)."""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError


async def main(url, calls, sse):
    out = {"tools": [], "calls": []}
    transport = sse_client(url, timeout=10) if sse else streamablehttp_client(url, timeout=10)
    async with transport as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await session.initialize()
            listed = await session.list_tools()
            out["tools"] = [t.name for t in listed.tools]
            out["descriptions"] = {t.name: t.description for t in listed.tools}
            for name, args in calls:
                try:
                    res = await session.call_tool(name, args)
                    text = " ".join(c.text for c in res.content if hasattr(c, "text"))
                    out["calls"].append({"tool": name, "is_error": res.isError, "text": text})
                except McpError as e:
                    out["calls"].append(
                        {"tool": name, "code": e.error.code, "message": e.error.message}
                    )
    print(json.dumps(out), flush=True)


args = sys.argv[1:]
sse = args[0] == "--sse"
if sse:
    args = args[1:]
calls = []
for arg in args[1:]:
    name, _, params = arg.partition("=")
    calls.append((name, json.loads(params or "{}")))
asyncio.run(asyncio.wait_for(main(args[0], calls, sse), 60))

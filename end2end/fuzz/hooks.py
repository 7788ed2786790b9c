"""Schemathesis hooks for the fuzz run (SCHEMATHESIS_HOOKS=hooks): JSON Lines, the body of
`POST /api/v1/import` and the answer of `GET /api/v1/export`, which schemathesis cannot
serialise or read by itself."""
import json

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return (json.dumps(value) + "\n").encode()


@schemathesis.deserializer("application/x-ndjson")
def ndjson_response(ctx, response):
    # Documented as text: the lines as sent.
    return response.content.decode(response.encoding or "utf-8")

"""OpenAI's official Python SDK (`openai`, unchanged from PyPI) pointed at Engram's LLM proxy:
`base_url = http://HOST/api/v1`, `api_key = engram_…`. The upstream is the stand-in LLM that
`make test` starts (`engram stand-in-llm`, ENGRAM_STANDIN_URL); it records what it receives.

Covers plain and streamed completions, the memory injected, injection off, the exchange
remembered and found by search, a dead upstream (502) and a dead key (401).
"""
import os
import socket
import time
import uuid

import httpx
import openai
import pytest
from openai import OpenAI

BASE = os.environ.get("ENGRAM_BASE_URL", "http://127.0.0.1:3000")
API = f"{BASE}/api"
STANDIN = os.environ.get("ENGRAM_STANDIN_URL", "http://127.0.0.1:3901/v1")


def account():
    """A human account's API key, with the stand-in as its upstream."""
    email = f"openai-{uuid.uuid4().hex[:10]}@example.com"
    with httpx.Client(base_url=API) as http:
        assert http.post("/auth/register", json={"email": email, "password": "password123"}).status_code == 200
        token = http.post("/auth/login", data={"username": email, "password": "password123"}).json()["access_token"]
        key = http.post("/keys", json={"name": "openai"}, headers={"Authorization": f"Bearer {token}"}).json()["data"]["key"]
        put = http.put("/v1/proxy/settings", headers={"X-API-Key": key},
                       json={"base_url": STANDIN, "api_key": "sk-standin", "model": "standin-small"})
        assert put.status_code == 200, put.text
    return key


def remember(key, content):
    """Stores a memory through the REST API and waits until it is searchable."""
    with httpx.Client(base_url=API, headers={"X-API-Key": key}) as http:
        task = http.post("/v1/memories", json={"content": content}).json()["task_id"]
        for _ in range(300):
            status = http.get(f"/v1/tasks/{task}").json()["data"]["status"]
            if status == "completed":
                return
            assert status in ("pending", "processing"), status
            time.sleep(0.1)
    raise AssertionError("memory never stored")


def received():
    """What the stand-in upstream received, newest last."""
    return httpx.get(STANDIN.replace("/v1", "/_requests")).json()


def test_plain_and_streamed_completions_carry_memories_and_are_remembered():
    key = account()
    marker = uuid.uuid4().hex[:6]
    remember(key, f"My daughter Mia is severely allergic to peanuts (note {marker}).")
    client = OpenAI(base_url=f"{API}/v1", api_key=key)

    raw = client.chat.completions.with_raw_response.create(
        model="standin-small",
        messages=[{"role": "system", "content": "You are a careful restaurant guide."},
                  {"role": "user", "content": "Which dishes should Mia avoid because of her peanut allergy?"}],
    )
    completion = raw.parse()
    reply = completion.choices[0].message.content
    assert f"allergic to peanuts (note {marker})" in reply, reply
    assert raw.headers["x-engram-memories"], "a memory was injected"
    conversation = raw.headers["x-engram-conversation"]
    assert completion.usage.completion_tokens > 0

    sent = received()[-1]
    assert sent["authorization"] == "Bearer sk-standin", "the upstream gets its own key, never ours"
    assert key not in str(sent)
    messages = sent["body"]["messages"]
    assert [m["role"] for m in messages] == ["system", "system", "user"]
    assert messages[1]["content"].startswith("Relevant memories")

    # Streamed, continuing the same conversation.
    stream = client.chat.completions.create(
        model="standin-small", stream=True,
        messages=[{"role": "user", "content": "And what about desserts for her?"}],
        extra_headers={"X-Engram-Conversation": conversation},
    )
    chunks = [c.choices[0].delta.content or "" for c in stream if c.choices]
    streamed = "".join(chunks)
    assert streamed.startswith("Stand-in reply to: And what about desserts for her?"), streamed
    assert len([c for c in chunks if c]) > 3, "the reply arrived in several chunks"

    # Both exchanges are in the conversation, and the replies are found by search.
    with httpx.Client(base_url=API, headers={"X-API-Key": key}) as http:
        for _ in range(300):
            got = http.get(f"/v1/conversations/{conversation}").json()
            if got["data"]["message_count"] == 4 and all(m["task_status"] == "completed" for m in got["messages"]):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"exchanges not remembered: {got}")
        assert got["messages"][3]["content"] == streamed
        found = http.post("/v1/memories/search", json={"query": f"desserts for Mia {marker}", "limit": 10}).json()
        assert any(h["metadata"].get("conversation_id") == conversation for h in found["data"]), found


def test_injection_off_forwards_the_messages_untouched():
    key = account()
    remember(key, "My daughter Mia is severely allergic to peanuts.")
    client = OpenAI(base_url=f"{API}/v1", api_key=key)
    messages = [{"role": "user", "content": "Which dishes should Mia avoid because of her peanut allergy?"}]
    raw = client.chat.completions.with_raw_response.create(
        model="standin-small", messages=messages,
        extra_headers={"X-Engram-Inject": "off", "X-Engram-Remember": "off"},
    )
    assert raw.headers["x-engram-memories"] == ""
    assert "x-engram-conversation" not in raw.headers
    assert "memories:" not in raw.parse().choices[0].message.content
    assert received()[-1]["body"]["messages"] == messages


def test_a_dead_upstream_is_502_and_a_dead_key_is_401():
    key = account()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    sock.close()
    put = httpx.put(f"{API}/v1/proxy/settings", headers={"X-API-Key": key}, json={"base_url": dead, "model": "standin-small"})
    assert put.status_code == 200, put.text
    client = OpenAI(base_url=f"{API}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="standin-small", messages=[{"role": "user", "content": "hello"}])
    assert failed.value.status_code == 502
    assert failed.value.body["type"] == "upstream_error"

    dead_key = OpenAI(base_url=f"{API}/v1", api_key="engram_" + "x" * 40, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        dead_key.chat.completions.create(model="standin-small", messages=[{"role": "user", "content": "hello"}])
    assert refused.value.status_code == 401
    assert refused.value.body["code"] == "invalid_api_key"

    # The model list answers in OpenAI's shape through the SDK too.
    models = client.models.list()
    assert [m.id for m in models.data][0] == "standin-small"

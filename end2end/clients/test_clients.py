"""Official clients, installed unchanged from PyPI, against the live server `make test` starts:
MCP's Python SDK (`mcp`) and MemoryX's two published SDKs (`t0ken-memoryx`,
`memoryx-server-sdk`). Each runs its whole flow; nothing here patches a client.

The MemoryX calls not covered yet, `send_conversation` (POST /v1/conversations/flush) and
`get_quota` / `verify_api_key` (GET /v1/quota), belong to the conversations and plans work.
"""
import json
import os
import time
import uuid

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from memoryx import APIClient
from memoryx_serversdk import MemoryxServerSDK, MemoryxServerSDKError

BASE = os.environ.get("ENGRAM_BASE_URL", "http://127.0.0.1:3000")
API = f"{BASE}/api"


def wait_success(get_status, task_id, timeout=60):
    """Polls a task through the client's own call until Celery's SUCCESS (or fails)."""
    deadline = time.time() + timeout
    while True:
        task = get_status(task_id)
        assert task["task_id"] == task_id, task
        if task["status"] == "SUCCESS":
            return task
        assert task["status"] in ("PENDING", "STARTED"), task
        assert time.time() < deadline, f"task {task_id} still {task['status']}"
        time.sleep(0.2)


def human_key():
    """A human account with an API key, made through the REST API."""
    email = f"sdk-{uuid.uuid4().hex[:10]}@example.com"
    with httpx.Client(base_url=API) as http:
        assert http.post("/auth/register", json={"email": email, "password": "password123"}).status_code == 200
        token = http.post("/auth/login", data={"username": email, "password": "password123"}).json()["access_token"]
        created = http.post("/keys", json={"name": "sdk"}, headers={"Authorization": f"Bearer {token}"})
        assert created.status_code == 200, created.text
        return created.json()["data"]["key"]


def test_memoryx_client_runs_its_whole_flow():
    client = APIClient({"api_base_url": API})
    registered = client.auto_register(agent_type="pytest")
    assert registered["api_key"].startswith("engram_")
    assert registered["agent_id"].startswith("pytest-")
    assert registered["project_id"] == "default"

    marker = uuid.uuid4().hex[:8]
    one = client.send_memories([{"content": f"Ana's passport number ends in 4417 ({marker})", "metadata": {"source": "pytest"}}])
    assert one["success"] and one["status"] == "pending", one
    done = wait_success(client.get_task_status, one["task_id"])
    assert done["result"]["memory_id"], done

    batch = client.send_memories([
        {"content": f"Ana's flight to Lisbon leaves on 3 March at 9:40 ({marker})"},
        {"content": f"Ana is severely allergic to peanuts ({marker})", "metadata": {"category": "semantic"}},
    ])
    assert batch["status"] == "pending", batch
    done = wait_success(client.get_task_status, batch["task_id"])
    assert done["result"]["batch"]["completed"] == 2, done

    found = client.search("which food is Ana allergic to?", limit=5)
    assert found["success"]
    top = found["data"][0]
    assert "peanuts" in top["content"], found
    assert top["category"] in ("episodic", "semantic", "procedural", "emotional", "reflective"), top
    assert 0 <= top["score"] <= 1

    listed = client.list(limit=50)
    mine = [m for m in listed["data"] if marker in m["content"]]
    assert len(mine) == 3, listed
    assert all(m["category"] != "other" for m in mine)

    client.delete(mine[0]["id"])
    after = client.list(limit=50)
    assert after["total"] == listed["total"] - 1
    assert mine[0]["id"] not in [m["id"] for m in after["data"]]


def test_memoryx_server_sdk_runs_its_whole_flow():
    sdk = MemoryxServerSDK(api_base_url=API)
    key = human_key()
    other = human_key()

    marker = uuid.uuid4().hex[:8]
    one = sdk.send_memories(key, [{"content": f"The staging database password rotates every Friday ({marker})"}])
    wait_success(lambda t: sdk.get_task_status(key, t), one["task_id"])
    batch = sdk.send_memories(key, [
        {"content": f"Deploys go out on Tuesdays after the standup ({marker})", "metadata": {"tags": ["ops"]}},
        {"content": f"The on-call phone number is +351 21 000 0000 ({marker})", "metadata": {"tags": ["ops", "contact"]}},
    ])
    wait_success(lambda t: sdk.get_task_status(key, t), batch["task_id"])

    hits = sdk.search(key, "when do deploys happen?", limit=3, categories=["semantic"], is_project_level=False)
    assert any("Tuesdays" in h["content"] for h in hits["data"]), hits

    listed = sdk.list(key, limit=10, offset=0, tags=["contact"])
    assert [m["content"] for m in listed["data"]] == [f"The on-call phone number is +351 21 000 0000 ({marker})"], listed
    today = time.strftime("%Y-%m-%d", time.gmtime())
    dated = sdk.list(key, limit=10, time_filter={"start": today})
    assert dated["total"] == 3, dated
    everything = sdk.list(key, limit=10)
    assert everything["total"] == 3

    # Another account sees none of it, and cannot delete it.
    assert sdk.list(other, limit=10)["total"] == 0
    with pytest.raises(MemoryxServerSDKError, match="not found"):
        sdk.delete(other, everything["data"][0]["id"])
    with pytest.raises(MemoryxServerSDKError, match="not found"):
        sdk.get_task_status(other, one["task_id"])

    sdk.delete(key, everything["data"][0]["id"])
    assert sdk.list(key, limit=10)["total"] == 2

    with pytest.raises(MemoryxServerSDKError, match="Invalid API key"):
        sdk.list("engram_" + "x" * 40, limit=1)


async def mcp_session(key, body):
    headers = {"X-API-Key": key} if key else {}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(f"{BASE}/mcp", http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                return await body(session, init)


def test_mcp_client_initializes_lists_adds_and_searches():
    key = human_key()
    marker = uuid.uuid4().hex[:8]

    async def flow(session, init):
        assert init.protocolVersion == "2025-06-18"
        assert init.serverInfo.name == "engram"
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == {"add_memory", "search_memories", "list_memories", "get_memory", "delete_memory", "list_projects", "get_task"}
        assert tools["add_memory"].inputSchema["required"] == ["content"]
        await session.send_ping()

        added = await session.call_tool("add_memory", {"content": f"Ana's locker code is 2719 ({marker})", "wait_seconds": 10})
        assert not added.isError, added
        task = added.structuredContent
        assert task["status"] == "completed", task

        found = await session.call_tool("search_memories", {"query": "what is Ana's locker code?", "limit": 3})
        assert not found.isError
        results = found.structuredContent["results"]
        assert results[0]["id"] == task["memory_id"], results
        assert json.loads(found.content[0].text)["results"][0]["content"].endswith(f"({marker})")

        got = await session.call_tool("get_memory", {"memory_id": task["memory_id"]})
        assert got.structuredContent["content"].startswith("Ana's locker code")
        listed = await session.call_tool("list_memories", {"limit": 5})
        assert listed.structuredContent["total"] == 1
        projects = await session.call_tool("list_projects", {})
        assert projects.structuredContent["projects"][0]["id"] == "default"
        status = await session.call_tool("get_task", {"task_id": task["task_id"]})
        assert status.structuredContent["memory_id"] == task["memory_id"]

        bad = await session.call_tool("add_memory", {"content": "   "})
        assert bad.isError and "content" in bad.content[0].text, bad
        missing = await session.call_tool("get_memory", {"memory_id": str(uuid.uuid4())})
        assert missing.isError and "not found" in missing.content[0].text

        deleted = await session.call_tool("delete_memory", {"memory_id": task["memory_id"]})
        assert not deleted.isError
        gone = await session.call_tool("list_memories", {})
        assert gone.structuredContent["total"] == 0

    anyio.run(mcp_session, key, flow)


def test_mcp_refuses_a_dead_or_missing_key_before_any_tool():
    # Over plain HTTP: 401 before the body is read.
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    for headers in ({}, {"X-API-Key": "engram_" + "x" * 40}, {"Authorization": "Bearer engram_" + "y" * 40}):
        r = httpx.post(f"{BASE}/mcp", json=init, headers={"Accept": "application/json, text/event-stream", **headers})
        assert r.status_code == 401, (headers, r.text)
    # A bearer engram_ key works like X-API-Key.
    key = human_key()
    r = httpx.post(f"{BASE}/mcp", json=init, headers={"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {key}"})
    assert r.status_code == 200 and r.json()["result"]["protocolVersion"] == "2025-06-18", r.text

    # Through the SDK: the session fails instead of running anything.
    async def never(session, init):
        raise AssertionError("initialized with a dead key")

    async def dead_key():
        with anyio.fail_after(20):
            await mcp_session("engram_" + "z" * 40, never)

    with pytest.raises(BaseException) as failure:
        anyio.run(dead_key)
    assert "initialized with a dead key" not in repr(failure.value)

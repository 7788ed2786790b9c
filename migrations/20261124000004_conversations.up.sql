-- Conversations: an account's chats, stored message by message. User and assistant messages are
-- also remembered (each a task, then a memory whose metadata names the conversation and the
-- message); system and tool messages are only stored.
create table conversations (
    id uuid primary key,
    user_id bigint not null,
    project_id text not null,
    -- The client's own id for it (MemoryX's `conversation_id` of a flush, or the proxy's
    -- `X-Engram-Conversation` when it is not one of ours), unique in the account.
    external_id text,
    title text,
    message_count int not null default 0,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    foreign key (user_id, project_id) references projects (user_id, id)
        on delete cascade on update cascade,
    constraint conversations_user_external_key unique (user_id, external_id)
);
create index conversations_user_updated_idx on conversations (user_id, updated_at desc, id);

create table conversation_messages (
    id uuid primary key,
    conversation_id uuid not null references conversations (id) on delete cascade,
    -- 1, 2, … in the conversation's order.
    position int not null,
    role text not null check (role in ('user', 'assistant', 'system', 'tool')),
    content text not null,
    name text,
    tokens int,
    -- When the client says it was sent; `created_at` is when we stored it.
    sent_at timestamptz,
    -- The task that remembers it (user and assistant messages).
    task_id uuid,
    created_at timestamptz not null default now(),
    unique (conversation_id, position)
);

-- A memory's stream (search's neighbour context) is its account, project, agent and, when its
-- metadata names one, its conversation: a conversation's turns are each other's neighbours even
-- when several conversations are stored side by side.
alter table memories add column stream text
    generated always as (coalesce(agent_id, '') || coalesce(' #' || (metadata ->> 'conversation_id'), '')) stored;
drop index memories_stream_idx;
create index memories_stream_idx on memories (user_id, project_id, stream, seq);

-- Upstream LLM endpoints of the proxy, per account. The API key is AES-256-GCM encrypted with
-- the server's key (`ENGRAM_SECRET_KEY`); only its last four characters are kept in clear.
create table proxy_settings (
    user_id bigint primary key references users (id) on delete cascade,
    base_url text not null,
    provider text,
    model text,
    api_key_nonce bytea,
    api_key_sealed bytea,
    api_key_last4 text,
    updated_at timestamptz not null default now()
);

-- One row per proxied chat completion: what statistics count (tokens, cost per model and day).
create table proxy_requests (
    id bigserial primary key,
    user_id bigint not null references users (id) on delete cascade,
    at timestamptz not null default now(),
    model text not null,
    conversation_id uuid,
    stream boolean not null,
    status int not null,
    prompt_tokens int not null default 0,
    completion_tokens int not null default 0,
    -- Whether the tokens were counted by us (characters / 4) because the upstream did not say.
    tokens_estimated boolean not null default false,
    -- USD from the model catalogue's prices; null for a model it does not list.
    cost_usd double precision,
    memories_injected int not null default 0,
    first_byte_ms real,
    total_ms real
);
create index proxy_requests_user_at_idx on proxy_requests (user_id, at);

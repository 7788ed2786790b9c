-- Engram schema. Application tables live in `public`; apalis keeps its queue in schema `apalis`.

-- Humans and machine accounts share one table: a machine account has no e-mail and no password,
-- only the SHA-256 of its fingerprint. A claimed machine keeps its row (so its fingerprint keeps
-- answering 409 and machine-stats can follow it) with `claimed_by` naming the human account.
create table users (
    id bigserial primary key,
    email text unique,
    password_hash text,
    is_machine boolean not null default false,
    fingerprint_hash bytea unique,
    platform text,
    hostname text,
    claimed_by bigint references users (id),
    claimed_at timestamptz,
    created_at timestamptz not null default now(),
    check (is_machine = (fingerprint_hash is not null))
);

-- `machine_id` remembers which machine account created a key, so a claimed machine's key still
-- counts as that machine's calls after it moved to the human account.
create table api_keys (
    id bigserial primary key,
    user_id bigint not null references users (id) on delete cascade,
    machine_id bigint references users (id) on delete set null,
    name text not null,
    key_hash bytea not null unique,
    key_prefix text not null,
    key_last4 text not null,
    created_at timestamptz not null default now(),
    last_used_at timestamptz
);
create index api_keys_user_idx on api_keys (user_id);
create index api_keys_machine_idx on api_keys (machine_id);

-- Per-key call counts, one row per key and hour, written in batches by the server (never once per
-- request).
create table api_key_usage (
    key_id bigint not null references api_keys (id) on delete cascade,
    hour timestamptz not null,
    calls bigint not null,
    primary key (key_id, hour)
);

-- A project id is unique within its account only; the default project's id is `default`.
create table projects (
    user_id bigint not null references users (id) on delete cascade,
    id text not null,
    name text not null,
    description text,
    created_at timestamptz not null default now(),
    primary key (user_id, id),
    constraint projects_user_name_key unique (user_id, name)
);

-- A task holds the memory's input until the worker has stored it; the queue job carries only the
-- task id. `on update cascade` lets a claim move a project with its tasks and memories in one
-- statement.
create table tasks (
    id uuid primary key,
    user_id bigint not null,
    project_id text not null,
    content text not null,
    metadata jsonb,
    agent_id text,
    status text not null default 'pending'
        check (status in ('pending', 'processing', 'completed', 'failed')),
    memory_id uuid,
    cognitive_sector text,
    importance_score real,
    error text,
    attempts int not null default 0,
    created_at timestamptz not null default now(),
    started_at timestamptz,
    completed_at timestamptz,
    foreign key (user_id, project_id) references projects (user_id, id)
        on delete cascade on update cascade
);
create index tasks_user_idx on tasks (user_id);

create table memories (
    id uuid primary key,
    user_id bigint not null,
    project_id text not null,
    -- One memory per task at most: a retried or re-delivered job cannot store a second one.
    task_id uuid unique,
    content text not null,
    metadata jsonb,
    agent_id text,
    cognitive_sector text not null
        check (cognitive_sector in ('episodic', 'semantic', 'procedural', 'emotional', 'reflective')),
    importance_score real not null check (importance_score between 0 and 1),
    embedding vector(384) not null,
    -- The model that produced `embedding`, so a model change can find and re-embed old rows.
    embedding_model text not null,
    tsv tsvector generated always as (to_tsvector('english', content)) stored,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    foreign key (user_id, project_id) references projects (user_id, id)
        on delete cascade on update cascade
);
create index memories_user_created_idx on memories (user_id, created_at desc, id);
create index memories_user_project_created_idx on memories (user_id, project_id, created_at desc, id);
create index memories_tsv_idx on memories using gin (tsv);
create index memories_embedding_idx on memories using hnsw (embedding vector_cosine_ops);

-- One live claim per machine; the code is stored as a hash only.
create table claims (
    machine_id bigint primary key references users (id) on delete cascade,
    human_id bigint not null references users (id) on delete cascade,
    code_hash bytea not null,
    expires_at timestamptz not null,
    failed_attempts int not null default 0,
    created_at timestamptz not null default now()
);

-- The development mailbox: every message when no SMTP transport is configured.
create table dev_mailbox (
    id bigserial primary key,
    to_address text not null,
    subject text not null,
    text_body text not null,
    html_body text not null,
    created_at timestamptz not null default now()
);

-- Portal sessions: tower-sessions records as JSON text (bytes: the record's id is an i128,
-- which a jsonb number cannot hold exactly).
create table sessions (
    id text primary key,
    data bytea not null,
    expiry_date timestamptz not null
);
create index sessions_expiry_idx on sessions (expiry_date);

-- Statistics and plans.
--
-- Statistics are read from roll-ups kept as the work happens, never by counting an account's
-- rows per page view:
-- - `memory_counts`: memories and bytes per account, project and sector, kept by statement
--   triggers on `memories` (one upsert per statement, whatever its number of rows: a worker's
--   batch, an import, a claim's move, a project's cascade);
-- - `usage_daily`: per account and UTC day, API calls and searches (written by each server
--   process in batches, see `core::stats`), memories created (the `memories` insert trigger),
--   tasks completed and failed with a histogram of their POST → completed times (a statement
--   trigger on `tasks`), proxy requests and tokens (a statement trigger on `proxy_requests`).
--
-- A latency histogram is an int[] of 80 buckets: bucket 0 holds times under 1 ms, bucket k ≥ 1
-- times in [2^((k-1)/4), 2^(k/4)) ms (19 % wide), the last everything from 2^(78/4) ms (about
-- 13 minutes) on. A median read from it is within 9 % of the true one.

create function hist_bucket(ms double precision) returns int language sql immutable as $$
    select case when ms < 1 then 0 else least(79, floor(4 * log(2, ms::numeric))::int + 1) end
$$;

-- The 80-bucket histogram of a list of buckets.
create function hist_of(buckets int[]) returns int[] language sql immutable as $$
    select array_agg((select count(*) from unnest(buckets) b where b = g)::int order by g)
    from generate_series(0, 79) g
$$;

-- Two histograms added bucket by bucket (an empty one is zero).
create function hist_add(a int[], b int[]) returns int[] language sql immutable as $$
    select coalesce(array_agg(coalesce(x, 0) + coalesce(y, 0) order by i), '{}')
    from unnest(a, b) with ordinality as t(x, y, i)
$$;

-- The bucket-by-bucket sum of many histograms.
create aggregate hist_sum(int[]) (sfunc = hist_add, stype = int[], initcond = '{}');

create table usage_daily (
    user_id bigint not null references users (id) on delete cascade,
    day date not null,
    api_calls bigint not null default 0,
    memories_created bigint not null default 0,
    searches bigint not null default 0,
    search_ms int[] not null default '{}',
    tasks_completed bigint not null default 0,
    tasks_failed bigint not null default 0,
    task_ms int[] not null default '{}',
    proxy_requests bigint not null default 0,
    proxy_tokens_in bigint not null default 0,
    proxy_tokens_out bigint not null default 0,
    primary key (user_id, day)
);

create table memory_counts (
    user_id bigint not null,
    project_id text not null,
    sector text not null,
    memories bigint not null default 0,
    bytes bigint not null default 0,
    primary key (user_id, project_id, sector)
);

-- What a memory occupies as counted for storage: its text, metadata and agent, and its vector.
create function memory_bytes(content text, metadata jsonb, agent_id text) returns bigint
language sql immutable as $$
    select octet_length(content)::bigint + coalesce(octet_length(metadata::text), 0)
        + coalesce(octet_length(agent_id), 0) + 1544
$$;

-- Rows are locked in (user, …) order in every statement that upserts them, so two writers
-- (the worker's store and the API's usage flush) can wait for each other but never deadlock.
create function memories_counted_insert() returns trigger language plpgsql as $$
begin
    insert into memory_counts (user_id, project_id, sector, memories, bytes)
    select user_id, project_id, cognitive_sector, count(*),
        sum(memory_bytes(content, metadata, agent_id))
    from new_rows group by 1, 2, 3 order by 1, 2, 3
    on conflict (user_id, project_id, sector) do update
        set memories = memory_counts.memories + excluded.memories,
            bytes = memory_counts.bytes + excluded.bytes;
    insert into usage_daily (user_id, day, memories_created)
    select user_id, (created_at at time zone 'utc')::date, count(*)
    from new_rows group by 1, 2 order by 1, 2
    on conflict (user_id, day) do update
        set memories_created = usage_daily.memories_created + excluded.memories_created;
    return null;
end $$;

create function memories_counted_delete() returns trigger language plpgsql as $$
begin
    insert into memory_counts (user_id, project_id, sector, memories, bytes)
    select user_id, project_id, cognitive_sector, -count(*),
        -sum(memory_bytes(content, metadata, agent_id))
    from old_rows group by 1, 2, 3 order by 1, 2, 3
    on conflict (user_id, project_id, sector) do update
        set memories = memory_counts.memories + excluded.memories,
            bytes = memory_counts.bytes + excluded.bytes;
    return null;
end $$;

create function memories_counted_update() returns trigger language plpgsql as $$
begin
    insert into memory_counts (user_id, project_id, sector, memories, bytes)
    select user_id, project_id, sector, sum(n), sum(b) from (
        select user_id, project_id, cognitive_sector as sector, -1 as n,
            -memory_bytes(content, metadata, agent_id) as b from old_rows
        union all
        select user_id, project_id, cognitive_sector, 1, memory_bytes(content, metadata, agent_id)
        from new_rows) d
    group by 1, 2, 3 having sum(n) <> 0 or sum(b) <> 0 order by 1, 2, 3
    on conflict (user_id, project_id, sector) do update
        set memories = memory_counts.memories + excluded.memories,
            bytes = memory_counts.bytes + excluded.bytes;
    return null;
end $$;

create trigger memories_counted_insert after insert on memories
    referencing new table as new_rows for each statement execute function memories_counted_insert();
create trigger memories_counted_delete after delete on memories
    referencing old table as old_rows for each statement execute function memories_counted_delete();
create trigger memories_counted_update after update on memories
    referencing old table as old_rows new table as new_rows
    for each statement execute function memories_counted_update();

-- A task reaching `completed` or `failed` counts on the day it did, with its POST → completed
-- time in the histogram (completed ones only).
create function tasks_counted() returns trigger language plpgsql as $$
begin
    insert into usage_daily (user_id, day, tasks_completed, tasks_failed, task_ms)
    select user_id, day, count(*) filter (where status = 'completed'),
        count(*) filter (where status = 'failed'),
        coalesce(hist_of(array_agg(bucket) filter (where status = 'completed')), '{}')
    from (
        select n.user_id, (n.completed_at at time zone 'utc')::date as day, n.status,
            hist_bucket(extract(epoch from n.completed_at - n.created_at)::double precision * 1000) as bucket
        from new_rows n join old_rows o on o.id = n.id
        where n.status in ('completed', 'failed') and o.status not in ('completed', 'failed')
            and n.completed_at is not null) d
    group by 1, 2 order by 1, 2
    on conflict (user_id, day) do update
        set tasks_completed = usage_daily.tasks_completed + excluded.tasks_completed,
            tasks_failed = usage_daily.tasks_failed + excluded.tasks_failed,
            task_ms = hist_add(usage_daily.task_ms, excluded.task_ms);
    return null;
end $$;

create trigger tasks_counted after update on tasks
    referencing old table as old_rows new table as new_rows
    for each statement execute function tasks_counted();

create function proxy_requests_counted() returns trigger language plpgsql as $$
begin
    insert into usage_daily (user_id, day, proxy_requests, proxy_tokens_in, proxy_tokens_out)
    select user_id, (at at time zone 'utc')::date, count(*), sum(prompt_tokens), sum(completion_tokens)
    from new_rows group by 1, 2 order by 1, 2
    on conflict (user_id, day) do update
        set proxy_requests = usage_daily.proxy_requests + excluded.proxy_requests,
            proxy_tokens_in = usage_daily.proxy_tokens_in + excluded.proxy_tokens_in,
            proxy_tokens_out = usage_daily.proxy_tokens_out + excluded.proxy_tokens_out;
    return null;
end $$;

create trigger proxy_requests_counted after insert on proxy_requests
    referencing new table as new_rows for each statement execute function proxy_requests_counted();

-- What exists already.
insert into memory_counts (user_id, project_id, sector, memories, bytes)
select user_id, project_id, cognitive_sector, count(*), sum(memory_bytes(content, metadata, agent_id))
from memories group by 1, 2, 3;

insert into usage_daily (user_id, day, memories_created)
select user_id, (created_at at time zone 'utc')::date, count(*) from memories group by 1, 2;

insert into usage_daily (user_id, day, api_calls)
select k.user_id, (u.hour at time zone 'utc')::date, sum(u.calls)
from api_key_usage u join api_keys k on k.id = u.key_id group by 1, 2
on conflict (user_id, day) do update set api_calls = excluded.api_calls;

insert into usage_daily (user_id, day, tasks_completed, tasks_failed, task_ms)
select user_id, (completed_at at time zone 'utc')::date, count(*) filter (where status = 'completed'),
    count(*) filter (where status = 'failed'),
    coalesce(hist_of(array_agg(hist_bucket(extract(epoch from completed_at - created_at)::double precision * 1000))
        filter (where status = 'completed')), '{}')
from tasks where status in ('completed', 'failed') and completed_at is not null group by 1, 2
on conflict (user_id, day) do update
    set tasks_completed = excluded.tasks_completed, tasks_failed = excluded.tasks_failed,
        task_ms = excluded.task_ms;

insert into usage_daily (user_id, day, proxy_requests, proxy_tokens_in, proxy_tokens_out)
select user_id, (at at time zone 'utc')::date, count(*), sum(prompt_tokens), sum(completion_tokens)
from proxy_requests group by 1, 2
on conflict (user_id, day) do update
    set proxy_requests = excluded.proxy_requests, proxy_tokens_in = excluded.proxy_tokens_in,
        proxy_tokens_out = excluded.proxy_tokens_out;

-- Tasks still to do, per account: the memories quota counts them with the stored ones.
create index tasks_open_idx on tasks (user_id) where status in ('pending', 'processing');

-- Plans: quotas as data. A null quota is unlimited. `is_default` marks the plan new accounts
-- get (`ENGRAM_DEFAULT_PLAN`, written at each start of `engram serve`).
create table plans (
    name text primary key check (name ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    display_name text not null,
    price_label text not null default '',
    memories bigint check (memories >= 0),
    api_calls_per_month bigint check (api_calls_per_month >= 0),
    searches_per_day bigint check (searches_per_day >= 0),
    proxy_tokens_per_month bigint check (proxy_tokens_per_month >= 0),
    projects bigint check (projects >= 0),
    machines bigint check (machines >= 0),
    is_default boolean not null default false,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now()
);
create unique index plans_one_default_idx on plans (is_default) where is_default;

insert into plans (name, display_name, price_label, is_default)
values ('unlimited', 'Unlimited', 'Self-hosted: no limits', true);
insert into plans (name, display_name, price_label, memories, api_calls_per_month,
    searches_per_day, proxy_tokens_per_month, projects, machines)
values ('free', 'Free', '$0 / month', 10000, 100000, 1000, 1000000, 5, 3);

create function default_plan() returns text language sql stable as $$
    select coalesce((select name from plans where is_default), 'unlimited')
$$;

alter table users
    add column plan text not null default default_plan() references plans (name),
    add column plan_until timestamptz;

-- Billing webhook events already applied: a replayed event is refused.
create table billing_events (
    id text primary key,
    type text not null,
    user_id bigint references users (id) on delete set null,
    plan text,
    received_at timestamptz not null default now()
);

-- Context for search.
--
-- `seq`: the order memories were submitted in. A memory's neighbours in its stream (same account,
-- project and agent) are often the rest of its conversation: an answer's question is in the turn
-- before it. Tasks take a number when they are queued (in request order, within a group commit
-- too) and the memory keeps its task's number.
create sequence memory_seq;
alter table tasks add column seq bigint not null default nextval('memory_seq');
alter table memories add column seq bigint;
update memories m set seq = t.seq from tasks t where t.id = m.task_id;
update memories set seq = nextval('memory_seq') where seq is null;
alter table memories alter column seq set default nextval('memory_seq'), alter column seq set not null;
-- A stream is an account's project and agent; `coalesce` so that memories without an agent form
-- one stream and the planner can see the agent condition as an equality.
create index memories_stream_idx on memories (user_id, project_id, (coalesce(agent_id, '')), seq);

-- `event_day`: the day a memory is about, from its metadata (`event_time`, `event_date`, `date`,
-- `timestamp` or `time`, read by the worker), else the day it was submitted (UTC). A query that
-- names a day, a month or a year favours memories of those days.
alter table memories add column event_day date;
update memories set event_day = (created_at at time zone 'utc')::date;
alter table memories alter column event_day set default ((now() at time zone 'utc')::date),
    alter column event_day set not null;
create index memories_user_day_idx on memories (user_id, event_day);

-- Vector candidates of a large scope through the HNSW index, scanned iteratively (the connection
-- settings) so the account or project filter never leaves it short. The SET clauses keep the
-- planner on the index when the table's statistics are stale or missing, where it would
-- otherwise sort the whole scope by distance.
create function memory_vector_candidates(account bigint, project text, query vector, k int)
returns setof uuid
language plpgsql stable
set enable_seqscan = off
set enable_sort = off
as $$
begin
    perform set_config('hnsw.ef_search', least(greatest(k, 40), 1000)::text, true);
    return query
        select id from memories
        where user_id = account and (project is null or project_id = project)
        order by embedding <=> query limit k;
end
$$;

-- Vectors stay in the row: stored out of line (pgvector's default, `external`), every exact scan
-- and every candidate's cosine read each vector through the TOAST index, about half the rows here
-- (a row is a little over TOAST's 2 kB threshold). Content, metadata and terms are compressed or
-- moved out of line first instead.
alter table memories alter column embedding set storage plain;

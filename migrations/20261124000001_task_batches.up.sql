-- A batch of memories (`POST /api/v1/memories/batch`) is one task for its client: a row here,
-- and one ordinary task per memory pointing at it. Its status is read from its tasks.
create table task_batches (
    id uuid primary key,
    user_id bigint not null references users (id) on delete cascade,
    total int not null,
    created_at timestamptz not null default now()
);
create index task_batches_user_idx on task_batches (user_id);
alter table tasks add column batch_id uuid;
create index tasks_batch_idx on tasks (batch_id) where batch_id is not null;

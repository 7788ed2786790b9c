drop index if exists tasks_batch_idx;
alter table tasks drop column if exists batch_id;
drop table if exists task_batches;

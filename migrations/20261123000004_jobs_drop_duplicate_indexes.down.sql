create unique index if not exists unique_job_id on apalis.jobs (id);
create index if not exists lidx on apalis.jobs (lock_by);

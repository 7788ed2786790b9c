-- apalis notifies its workers once per inserted job (`notify_workers`, FOR EACH ROW: a PL/pgSQL
-- call, a JSON payload and a queued notification per row). The memory writer inserts a whole
-- batch of jobs in one statement, and a worker only needs to hear "there are new jobs": one
-- notification per queue and statement, in the payload apalis's listener reads (its first job).
-- Measured with pgbench, 63 jobs per statement: 1.54 ms per statement with the per-row trigger,
-- 1.33 ms without; and a burst of 10,000 memories no longer wakes the worker 10,000 times.
create function apalis.notify_new_jobs_per_statement() returns trigger
language plpgsql as $$
declare
    queue record;
begin
    for queue in
        select job_type, min(id) as id, min(run_at) as run_at
        from new_jobs
        where run_at <= now()
        group by job_type
    loop
        perform pg_notify(
            'apalis::job::insert',
            json_build_object('job_type', queue.job_type, 'id', queue.id, 'run_at', queue.run_at)::text
        );
    end loop;
    return null;
end
$$;

drop trigger if exists notify_workers on apalis.jobs;
create trigger notify_workers_per_statement
    after insert on apalis.jobs
    referencing new table as new_jobs
    for each statement execute function apalis.notify_new_jobs_per_statement();

drop trigger if exists notify_workers_per_statement on apalis.jobs;
drop function if exists apalis.notify_new_jobs_per_statement();
create trigger notify_workers
    after insert on apalis.jobs
    for each row execute function apalis.notify_new_jobs();

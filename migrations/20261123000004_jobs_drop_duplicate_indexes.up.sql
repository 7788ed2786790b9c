-- apalis's jobs table carries two of its indexes twice: `unique_job_id` repeats the primary key
-- (id), and `lidx` repeats `idx_apalis_jobs_lock_by` (lock_by); apalis-postgres 1.0's
-- `streamline_indices` migration added the new ones and kept these. Every new job (a memory's
-- write waits for its job) and every change of a job's status or lock (not a HOT update: an
-- indexed column changes) paid for both copies: pgbench, 63 tasks with their jobs in one
-- statement, 2.99 ms with them and 2.48 ms without (means of five runs each, alternated).
drop index if exists apalis.unique_job_id;
drop index if exists apalis.lidx;

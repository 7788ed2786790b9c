-- Every claim/init and every wrong claim code, kept a day: the limits on claims count here, not
-- on the one live claim row (which a new init replaces), so starting over resets nothing, and
-- every process of a deployment reads the same counts.
create table claim_attempts (
    id bigserial primary key,
    machine_id bigint not null references users (id) on delete cascade,
    -- The e-mail named, lower-cased (also when no account has it).
    email text not null,
    -- `init` or `wrong_code`.
    kind text not null check (kind in ('init', 'wrong_code')),
    -- Whether the attempt came through the agents API (not the logged-in human's portal page).
    by_agent boolean not null default true,
    at timestamptz not null default now()
);
create index claim_attempts_machine_idx on claim_attempts (machine_id, kind, at);
create index claim_attempts_email_idx on claim_attempts (email, kind, at);
create index claim_attempts_at_idx on claim_attempts (at);

-- The public model catalogue (`engram models import`, from litellm's price list). The id is the
-- list's key, so a re-import of a newer list updates rows in place. Prices are exact decimals
-- in USD per million tokens.
create table models (
    id text primary key,
    provider text not null,
    mode text not null,
    family text,
    context_window bigint,
    max_output_tokens bigint,
    input_price_per_mtok numeric,
    output_price_per_mtok numeric,
    capabilities text[] not null default '{}',
    deprecation_date date,
    source text,
    updated_at timestamptz not null default now()
);

-- One row: bumped by every import, so each process knows when to reload its copy.
create table model_catalog (
    only_row boolean primary key default true check (only_row),
    version bigint not null default 0,
    imported_at timestamptz,
    source_sha256 text
);
insert into model_catalog (only_row) values (true);

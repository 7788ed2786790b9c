-- Terms stay in the row, like vectors (20261122000003). Stored out of line (the default for a row
-- a little over TOAST's 2 kB threshold), the keyword part read every candidate's terms through the
-- TOAST index: 20 µs a candidate at 100,000 memories. Content and metadata are compressed or moved
-- out instead; they are read only for the results shown. Rows written before this keep their
-- storage until they are rewritten.
alter table memories alter column tsv set storage main;

alter table memories alter column tsv set storage extended;

drop table model_catalog;
drop table models;

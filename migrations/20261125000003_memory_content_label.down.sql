alter table memories drop column content_label;

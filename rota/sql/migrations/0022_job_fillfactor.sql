-- Room kept free on each page of rota.job for the versions a job's claim and
-- outcome write.
--
-- Every UPDATE of a job changes indexed columns (its status, in the partial
-- indexes' conditions), so none is HOT; still, a new version that fits on the
-- row's own page touches no other heap page. A table of finished jobs,
-- vacuumed, has a little free space on many pages, and new jobs go one to a
-- page; with every page filled to the last byte, the claim's and the
-- outcome's versions of each then went to yet other pages, and after a
-- checkpoint each page first touched writes a full-page image: a two-process
-- drain beside 2,000,000 done rows wrote 9,676 WAL bytes a job and ran at
-- 0.82 of the drain on an empty table; with 10 % of each page kept free,
-- 1,502 bytes and 0.97, the empty table's drain unchanged (bench/JOURNAL.md).
-- Pages written from now on keep the room; rows already stored stay as they
-- are.

ALTER TABLE rota.job SET (fillfactor = 90);

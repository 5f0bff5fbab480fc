//! `weft jobs render`: every pod and job-level object a job will get (being written).

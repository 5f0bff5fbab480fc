//! The Volcano Job controller: job-level objects of weft plugins (being written).

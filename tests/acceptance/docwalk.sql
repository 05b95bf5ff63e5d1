-- A database of its own for each walk of a page: a reader starts from an empty one.

-- name: database_create
CREATE DATABASE {database};

-- name: database_drop
DROP DATABASE IF EXISTS {database} WITH (FORCE);

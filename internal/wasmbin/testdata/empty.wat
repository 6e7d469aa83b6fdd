;; A module with no sections at all: the rewrite must create the type, import
;; and global sections.
(module)

"""The file formats the wrappers read: KV views (``kv``), paged caches and page tables (``paged``), ragged K/V
(``ragged``) and custom masks (``mask``)."""

// Package provision is the ops tooling's bootstrap writer, as Ansible would
// be: the only code with rights to create databases and roles. It creates the
// registry database and its read-only role, and each tenant's database, login
// role, grants and registry row; nothing at run time links it or holds the
// rights it needs. Its callers, each with the admin URL: brainctl
// (production), devstack init and up (the dev stack), brain-eval store
// (an eval report into the registry) and the tests.
package provision

/* dlock(1): distributed locks for shell scripts, on Redis. The whole tool
 * is cli_main (commands.c); the fuzz target (tests/fuzz/fuzz_cli.c) calls
 * it itself. */
#include "cmds.h"

#ifndef DLOCK_CLI_FUZZ
int main(int argc, char **argv) { return cli_main(argc, argv); }
#endif

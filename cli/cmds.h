/* The commands of the dlock tool. Each takes the command's own argv (argv[0]
 * is the command name), the global options parsed so far, and returns the
 * process exit code. Each has a help text printed by `dlock help CMD`. */
#ifndef DLOCK_CLI_CMDS_H
#define DLOCK_CLI_CMDS_H

#include "util.h"

typedef int (*cli_cmd_fn)(int argc, char **argv, cli_global *g);

int cmd_run(int argc, char **argv, cli_global *g);          /* cmd_run.c */
int cmd_acquire(int argc, char **argv, cli_global *g);      /* cmd_token.c */
int cmd_release(int argc, char **argv, cli_global *g);      /* cmd_token.c */
int cmd_extend(int argc, char **argv, cli_global *g);       /* cmd_token.c */
int cmd_status(int argc, char **argv, cli_global *g);       /* cmd_inspect.c */
int cmd_list(int argc, char **argv, cli_global *g);         /* cmd_inspect.c */
int cmd_force_unlock(int argc, char **argv, cli_global *g); /* cmd_inspect.c */
int cmd_doctor(int argc, char **argv, cli_global *g);       /* cmd_doctor.c */
int cmd_id(int argc, char **argv, cli_global *g);           /* cmd_id.c */
int cmd_latch(int argc, char **argv, cli_global *g);        /* cmd_latch.c */

extern const char help_run[], help_acquire[], help_release[], help_extend[], help_status[],
    help_list[], help_force_unlock[], help_doctor[], help_id[], help_latch[];

/* The whole tool: parses argv (global options, then the command) and runs
 * the command; returns the process exit code. main() only returns it: no
 * path of the tool calls exit() (run's child and run's death by a signal
 * while it waits for a held lock use _exit(), after connecting). cli_main()
 * expects getopt's state fresh (optind 1, as at start; optind 0 resets it). */
int cli_main(int argc, char **argv);

/* Prints the help of cmd (NULL: the overview) on f; 0, or -1 if unknown. */
int cli_print_help(FILE *f, const char *cmd);
/* For the default branch of a command's option loop: handles opt as above
 * (printing the command's help for --help). Returns 1 to go on, or 0 after
 * storing the exit code (0 for --help) in *code. */
int cli_default_opt(cli_global *g, const char *cmd, int opt, char *const *argv, int *code);

#endif

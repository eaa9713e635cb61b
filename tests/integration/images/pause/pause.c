/* The sandbox's init: holds the pod's namespaces open, reaps the zombies that
 * processes exec'd into the pod leave behind (they are reparented to pid 1),
 * and exits 0 on SIGTERM/SIGINT as Kubernetes' pause does, so stopping a
 * sandbox never waits for a SIGKILL. Built with `gcc -static -Os -s`. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) {
	(void)sig;
	_exit(0);
}

static void on_child(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(void) {
	struct sigaction term = {.sa_handler = on_term};
	struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
	sigemptyset(&term.sa_mask);
	sigemptyset(&child.sa_mask);
	if (sigaction(SIGTERM, &term, NULL) || sigaction(SIGINT, &term, NULL) ||
	    sigaction(SIGCHLD, &child, NULL))
		return 1;
	for (;;)
		pause();
}

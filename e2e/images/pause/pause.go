// Command pause holds a pod's namespaces open until it is told to stop.
//
// It is the sandbox ("infra") container of every pod on the e2e cluster,
// built here because no image registry is reachable. As PID 1 of a pod that
// shares its process namespace it also reaps orphaned children, like the
// upstream pause.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const version = "ckptdrain-pause 1.0"

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-v" || os.Args[1] == "--version") {
		fmt.Println(version)
		return
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

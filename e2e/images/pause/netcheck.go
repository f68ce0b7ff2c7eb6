// Command netcheck is the e2e cluster's smoke-test helper: a TCP server that
// greets every connection with its hostname, and a client that dials an
// address until it gets an answer (or a deadline passes).
//
//	netcheck serve :8080
//	netcheck get 10.96.0.10:80 [timeout]   prints what the server said
//	netcheck dial 10.96.0.1:443 [timeout]  only checks that it connects
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: netcheck serve ADDR | get ADDR [TIMEOUT] | dial ADDR [TIMEOUT]")
		os.Exit(2)
	}
	mode, addr := os.Args[1], os.Args[2]
	timeout := 30 * time.Second
	if len(os.Args) > 3 {
		d, err := time.ParseDuration(os.Args[3])
		if err != nil {
			fmt.Fprintln(os.Stderr, "netcheck: bad timeout:", err)
			os.Exit(2)
		}
		timeout = d
	}
	switch mode {
	case "serve":
		serve(addr)
	case "get", "dial":
		os.Exit(get(addr, timeout, mode == "get"))
	default:
		fmt.Fprintln(os.Stderr, "netcheck: unknown mode", mode)
		os.Exit(2)
	}
}

func serve(addr string) {
	name, _ := os.Hostname()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "netcheck:", err)
		os.Exit(1)
	}
	fmt.Println("serving on", l.Addr())
	for {
		c, err := l.Accept()
		if err != nil {
			continue
		}
		go func(c net.Conn) {
			defer c.Close()
			fmt.Fprintf(c, "hello from %s\n", name)
		}(c)
	}
}

func get(addr string, timeout time.Duration, read bool) int {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			if !read {
				c.Close()
				fmt.Println("connected to", addr)
				return 0
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b, err := io.ReadAll(c)
			c.Close()
			if err == nil && len(b) > 0 {
				fmt.Print(string(b))
				return 0
			}
			last = err
		} else {
			last = err
		}
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "netcheck: no answer from %s within %s: %v\n", addr, timeout, last)
	return 1
}
